// dion_comm on its own, in one process: environment checks of Group::init_from_env, a group of
// one (Work, async collectives, FSDP2 chunks), and the one-thread task runtime (schedule equal
// to the reference's AsyncRuntime, serial tasks, errors, no threads). The multi-process behaviour
// (collectives over Gloo, overlap inside the optimizer) is in test_dist.
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dion/comm/chunks.h"
#include "dion/comm/group.h"
#include "dion/comm/tasks.h"
#include "free_port.h"
#include "threads.h"

namespace {

using dion::comm::CommError;
using dion::comm::Group;
using dion::comm::Task;

// ---------------------------------------------------------------------------- environment

// Sets torchrun's variables for one test and restores the unset state afterwards.
class Env : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  }
  static void set(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  // The CommError message init_from_env throws ("" when it does not throw).
  static std::string error() {
    try {
      Group::init_from_env();
    } catch (const CommError& e) {
      return e.what();
    }
    return "";
  }
};

const std::vector<std::pair<const char*, const char*>> kGood = {
    {"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};

TEST_F(Env, NoVariablesMeanOneProcess) {
  Group g = Group::init_from_env();
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.local_rank(), 0);
}

TEST_F(Env, PortOutOfRangeNamesTheVariableAndTheRange) {
  set(kGood);
  set({{"MASTER_PORT", "70000"}});
  const std::string e = error();
  EXPECT_NE(e.find("MASTER_PORT='70000'"), std::string::npos) << e;
  EXPECT_NE(e.find("[1, 65535]"), std::string::npos) << e;
  set({{"MASTER_PORT", "0"}});
  EXPECT_NE(error().find("[1, 65535]"), std::string::npos);
  set({{"MASTER_PORT", "29500x"}});
  EXPECT_NE(error().find("MASTER_PORT='29500x'"), std::string::npos);
}

TEST_F(Env, RankAndLocalRankMustBeBelowTheWorldSize) {
  set(kGood);
  set({{"RANK", "2"}});
  std::string e = error();
  EXPECT_NE(e.find("RANK='2'"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 1]"), std::string::npos) << e;
  set({{"RANK", "0"}, {"LOCAL_RANK", "-1"}});
  e = error();
  EXPECT_NE(e.find("LOCAL_RANK='-1'"), std::string::npos) << e;
  set({{"LOCAL_RANK", "0"}, {"RANK", "99999999999999999999"}});
  EXPECT_NE(error().find("RANK='99999999999999999999'"), std::string::npos);
}

TEST_F(Env, WorldSizeAndMissingVariables) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_NE(error().find("WORLD_SIZE='0'"), std::string::npos);
  set({{"WORLD_SIZE", "two"}});
  EXPECT_NE(error().find(">= 1"), std::string::npos);
  set({{"WORLD_SIZE", "2"}, {"RANK", "1"}});
  EXPECT_NE(error().find("MASTER_ADDR is not set"), std::string::npos);
  set({{"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_NE(error().find("MASTER_PORT is not set"), std::string::npos);
}

// Half of torchrun's environment is an error, not one process (RANK=0 alone ran as one
// process; WORLD_SIZE=2 alone asked for a RANK but said nothing of the pair).
TEST_F(Env, RankWithoutWorldSizeOrTheReverseIsAnError) {
  set({{"RANK", "0"}});
  std::string e = error();
  EXPECT_NE(e.find("RANK='0' is set but WORLD_SIZE is not: set both"), std::string::npos) << e;
  clear();
  set({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  e = error();
  EXPECT_NE(e.find("WORLD_SIZE='2' is set but RANK is not"), std::string::npos) << e;
  clear();
  set({{"LOCAL_RANK", "0"}});  // LOCAL_RANK alone: one process (as before)
  EXPECT_EQ(error(), "");
}

// A rendezvous that cannot complete ends within the rendezvous timeout on every rank that came,
// saying how many of how many arrived (WORLD_SIZE=2 with one process started waited 301 s and
// said "Timed out ... waiting for clients" with a C++ backtrace).
TEST_F(Env, ARendezvousShortOfRanksSaysHowManyArrived) {
  const std::string port = std::to_string(dion::testing::free_port());
  set({{"WORLD_SIZE", "3"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port.c_str()}});
  dion::comm::GroupOptions o, o1;
  o.rendezvous_timeout = std::chrono::seconds(3);
  o1.rendezvous_timeout = std::chrono::seconds(2);  // gives up first, while rank 0's store still answers
  // Rank 1 comes (in a thread of this process, through Group::create); rank 2 never does.
  std::string e1;
  std::thread one([&] {
    try {
      Group::create("127.0.0.1", std::stoi(port), 1, 3, o1);
    } catch (const CommError& x) {
      e1 = x.what();
    }
  });
  std::string e0;
  try {
    Group::init_from_env(o);
  } catch (const CommError& x) {
    e0 = x.what();
  }
  one.join();
  for (const std::string* e : {&e0, &e1}) {
    EXPECT_NE(e->find("only 2 of 3 ranks arrived at the rendezvous 127.0.0.1:" + port + " within "), std::string::npos)
        << *e;
    EXPECT_NE(e->find("--nproc_per_node 3"), std::string::npos) << *e;
    EXPECT_EQ(e->find("Exception raised from"), std::string::npos) << *e;
  }
  EXPECT_NE(e0.find("within 3000 ms"), std::string::npos) << e0;
  EXPECT_NE(e0.find("rank 0 of 3"), std::string::npos) << e0;
  EXPECT_NE(e1.find("rank 1 of 3"), std::string::npos) << e1;
}

// Two processes given the same RANK: the second to reach the store is told so (it used to take
// the first one's place in the store's bookkeeping and hang or fail obscurely in Gloo). Which of
// the two threads is second is up to the scheduler (the later one starts 500 ms late, but a
// loaded machine can delay the first one's connection past it); the other waits for the third
// rank like rank 0.
TEST_F(Env, TheSameRankTwiceIsAnError) {
  const int port = dion::testing::free_port();
  dion::comm::GroupOptions o, o1;
  o.rendezvous_timeout = std::chrono::seconds(3);
  o1.rendezvous_timeout = std::chrono::seconds(2);
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  const int rank_of[3] = {0, 1, 1};
  for (int i = 0; i < 3; ++i)
    ranks.emplace_back([&, i] {
      if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the second "rank 1"
      try {
        Group::create("127.0.0.1", port, rank_of[i], 3, i == 0 ? o : o1);
      } catch (const CommError& x) {
        errors[i] = x.what();
      }
    });
  for (auto& t : ranks) t.join();
  const std::string told = "another process with RANK=1 already joined the rendezvous";
  const bool later_told = errors[2].find(told) != std::string::npos;
  const std::string& second = later_told ? errors[2] : errors[1];
  const std::string& first = later_told ? errors[1] : errors[2];
  EXPECT_NE(second.find(told), std::string::npos) << "rank 1: " << errors[1] << "\nthe other rank 1: " << errors[2];
  EXPECT_NE(first.find("only 2 of 3 ranks arrived"), std::string::npos) << first;
  EXPECT_NE(errors[0].find("only 2 of 3 ranks arrived"), std::string::npos) << errors[0];
}

// A listening socket whose backlog completes the TCP handshake but which never accept()s nor
// answers: "a process that accepts but never answers". A client rank must give up within the
// group's timeout with a message naming the address, the port and what to check, not hang.
TEST_F(Env, PortThatAcceptsButNeverAnswersFailsWithinTheTimeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;  // ephemeral
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));

  set({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port.c_str()}});
  dion::comm::GroupOptions o;
  o.rendezvous_timeout = std::chrono::seconds(2);
  const int threads_before = dion::testing::thread_count();
  const auto t0 = std::chrono::steady_clock::now();
  std::string e;
  try {
    Group::init_from_env(o);
  } catch (const CommError& x) {
    e = x.what();
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  // No-hang property, not a speed assertion: it returned, long before a generous bound.
  EXPECT_LT(waited, std::chrono::seconds(30));
  EXPECT_NE(e.find("127.0.0.1:" + port), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 of 2"), std::string::npos) << e;
  EXPECT_NE(e.find("2000 ms"), std::string::npos) << e;
  EXPECT_NE(e.find("is another program listening on that port?"), std::string::npos) << e;
  EXPECT_NE(e.find("is rank 0 running the same job?"), std::string::npos) << e;

  // Closing the listener resets the pending connection, so the connecting thread left behind
  // fails and ends; wait for it (bounded) so later tests that count threads see a steady count.
  ::close(fd);
  for (int i = 0; i < 300 && dion::testing::thread_count() > threads_before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(dion::testing::thread_count(), threads_before);
}

// ---------------------------------------------------------------------------- a group of one

TEST(GroupOfOne, AsyncCollectivesAreLocal) {
  Group g;
  at::Tensor x = at::arange(6, at::kFloat).view({2, 3});
  dion::comm::Work w = g.all_gather_async(x);
  EXPECT_TRUE(w.waited());
  at::Tensor all = w.wait();
  EXPECT_EQ(all.sizes(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(at::equal(all[0], x));
  EXPECT_TRUE(at::equal(g.all_to_all(x), x));
  at::Tensor y = x.clone();
  g.all_reduce_(y);
  EXPECT_TRUE(at::equal(y, x));
  EXPECT_EQ(g.stats().total_bytes(), 0);  // nothing went over a wire
  EXPECT_FALSE(dion::comm::Work().wait().defined());
}

// FSDP2 chunks (dion/comm/chunks.h): ceil(size / world) a rank, the last ones short or empty;
// in a group of one, the gather and the reduce-scatter give the whole tensor back.
TEST(Chunks, ContiguousChunksOfCeilSizeOverWorld) {
  std::vector<int64_t> starts, lengths;
  for (int r = 0; r < 4; ++r) {
    const dion::comm::Chunk c = dion::comm::shard_range(3, 4, r);  // 1, 1, 1, 0
    starts.push_back(c.start);
    lengths.push_back(c.length);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(lengths, (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(dion::comm::shard_range(18, 4, 3).length, 3);  // 5, 5, 5, 3
  at::Tensor full = at::arange(18 * 2, at::kFloat).view({18, 2});
  at::Tensor last = dion::comm::shard_tensor(full, 0, 4, 3);
  EXPECT_TRUE(at::equal(last, full.narrow(0, 15, 3)));
  EXPECT_TRUE(last.is_contiguous());
  EXPECT_NE(last.data_ptr(), full.data_ptr());  // a copy, never a view
  at::Tensor padded = dion::comm::pad_to(last, -2, 5);
  EXPECT_EQ(padded.sizes(), (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(padded.narrow(0, 3, 2).abs().sum().item<float>(), 0.0f);

  Group g;
  EXPECT_TRUE(at::equal(dion::comm::gather_tensor(g, full, 1, 2), full));
  EXPECT_TRUE(at::equal(dion::comm::reduce_scatter(g, full, 0), full));
}

// A torch group with only a CUDA backend, as init_process_group("nccl") makes: wrapping it is
// accepted (its control tensors live on the GPU), and a CPU tensor on it is refused with a
// CommError naming the group, before anything is sent. (No GPU needed: the backend is a stub
// that is never called; NCCL itself runs only on a multi-GPU machine.)
TEST(TorchGroup, CudaOnlyGroupIsAcceptedAndRefusesCpuTensors) {
  struct StubBackend : c10d::Backend {
    StubBackend() : c10d::Backend(0, 2) {}
    const std::string getBackendName() const override { return "stub"; }
  };
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(c10::make_intrusive<c10d::HashStore>(), 0, 2);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL,
                 c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<StubBackend>()));
  Group g = Group::from_process_group(pg, {0, 1});
  EXPECT_EQ(g.size(), 2);
  EXPECT_EQ(g.control_device().type(), c10::DeviceType::CUDA);
  at::Tensor x = at::ones({4});
  try {
    g.all_reduce_(x);
    FAIL() << "a CPU tensor on a CUDA-only group was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("no backend for CPU tensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("torch:"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.stats().calls("all_reduce"), 0);  // nothing was issued
}

// ---------------------------------------------------------------------------- tasks

using dion::testing::thread_count;

using Trace = std::vector<std::pair<int, int>>;  // (task, phase)

// n tasks, each logging phases 0..2 with a yield between them.
std::vector<Task> phased_tasks(int n, Trace& trace, std::vector<int>* threads = nullptr) {
  std::vector<Task> tasks;
  for (int i = 0; i < n; ++i)
    tasks.push_back({[i, &trace, threads] {
      for (int phase = 0; phase < 3; ++phase) {
        if (phase > 0) dion::comm::yield();
        trace.emplace_back(i, phase);
        if (threads) threads->push_back(thread_count());
      }
    }});
  return tasks;
}

TEST(Tasks, ScheduleIsTheReferenceAsyncRuntimes) {
  // The reference's AsyncRuntime (dion/opt_utils.py) with max_concurrent_tasks=2 over three
  // generators `log(i, 0); yield; log(i, 1); yield; log(i, 2)` logs exactly this (run with the
  // reference's classes).
  Trace trace;
  auto tasks = phased_tasks(3, trace);
  dion::comm::run_tasks(tasks, 2);
  const Trace reference = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {2, 0}, {1, 2}, {2, 1}, {2, 2}};
  EXPECT_EQ(trace, reference);
}

TEST(Tasks, OneInFlightRunsInOrderAndNoThreadIsStarted) {
  Trace one, three;
  auto a = phased_tasks(5, one);
  dion::comm::run_tasks(a, 1);
  for (size_t k = 0; k < one.size(); ++k)
    EXPECT_EQ(one[k], std::make_pair(static_cast<int>(k / 3), static_cast<int>(k % 3)));
  std::vector<int> threads;
  const int before = thread_count();
  auto b = phased_tasks(5, three, &threads);
  dion::comm::run_tasks(b, 3);
  EXPECT_EQ(three.size(), one.size());
  for (int t : threads) EXPECT_EQ(t, before);
  EXPECT_EQ(thread_count(), before);
  EXPECT_NE(three, one);  // interleaved
}

TEST(Tasks, SerialTasksDoNotOverlapEachOther) {
  // Tasks 0, 2, 3 serial: each serial task ends before the next serial one starts, while the
  // plain task 1 interleaves with them.
  Trace trace;
  auto tasks = phased_tasks(5, trace);
  for (int i : {0, 2, 3}) tasks[i].serial = true;
  dion::comm::run_tasks(tasks, 3);
  auto pos = [&](int task, int phase) {
    return std::find(trace.begin(), trace.end(), std::make_pair(task, phase)) - trace.begin();
  };
  EXPECT_LT(pos(0, 2), pos(2, 0));
  EXPECT_LT(pos(2, 2), pos(3, 0));
  EXPECT_LT(pos(1, 0), pos(0, 2));  // task 1 ran while task 0 was in flight
}

TEST(Tasks, FirstErrorInTaskOrderAfterTheTasksInFlightFinish) {
  // Task 1 fails at its second phase, task 0 at its third; task 2 is in flight and finishes;
  // tasks 3 and 4 never start. The first error in task order (task 0's) is rethrown.
  Trace trace;
  std::vector<Task> tasks;
  for (int i = 0; i < 5; ++i)
    tasks.push_back({[i, &trace] {
      for (int phase = 0; phase < 3; ++phase) {
        if (phase > 0) dion::comm::yield();
        if ((i == 1 && phase == 1) || (i == 0 && phase == 2))
          throw std::invalid_argument("task " + std::to_string(i) + " failed");
        trace.emplace_back(i, phase);
      }
    }});
  try {
    dion::comm::run_tasks(tasks, 3);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "task 0 failed");
  }
  for (const auto& [task, phase] : trace) EXPECT_LT(task, 3) << "task " << task << " started after a failure";
  EXPECT_NE(std::find(trace.begin(), trace.end(), std::make_pair(2, 2)), trace.end()) << "task 2 did not finish";
}

TEST(Tasks, YieldOutsideATaskAndNestedRunsAreInline) {
  EXPECT_FALSE(dion::comm::in_task());
  dion::comm::yield();  // no-op
  Trace inner;
  std::vector<Task> outer = {{[&] {
                               EXPECT_TRUE(dion::comm::in_task());
                               auto nested = phased_tasks(2, inner);
                               dion::comm::run_tasks(nested, 2);  // inline: 0,0 0,1 0,2 1,0 ...
                             }},
                             {[] {}}};
  dion::comm::run_tasks(outer, 2);
  const Trace sequential = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
  EXPECT_EQ(inner, sequential);
}

TEST(Tasks, DeepStacksAndTorchOpsInsideTasks) {
  // A task's stack holds ordinary ATen work (a QR and a matmul) and a few MiB of locals.
  std::vector<at::Tensor> out(3);
  std::vector<Task> tasks;
  for (int i = 0; i < 3; ++i)
    tasks.push_back({[i, &out] {
      volatile char big[4 << 20];
      big[0] = static_cast<char>(i);
      big[sizeof(big) - 1] = big[0];
      at::Tensor a = at::randn({64, 64}, at::TensorOptions().dtype(at::kDouble));
      dion::comm::yield();
      at::Tensor q = std::get<0>(at::linalg_qr(a));
      out[i] = q.t().mm(q);
    }});
  dion::comm::run_tasks(tasks, 3);
  for (const auto& t : out) EXPECT_TRUE(at::allclose(t, at::eye(64, t.options()), 1e-10, 1e-10));
}

}  // namespace
