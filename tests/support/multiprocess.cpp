// The launcher and child helpers of the multi-process tests (see multiprocess.h).
#include "multiprocess.h"
#include "free_port.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

namespace dion::testing {

// ---------------------------------------------------------------------------- parent

RunResult launch(const std::string& scenario, int world, int deadline_s) {
  const int port = free_port();
  std::vector<pid_t> pids;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::execl("/proc/self/exe", "multiprocess-child", "--child", scenario.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  RunResult res;
  res.exit_codes.assign(world, -2);
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (res.exit_codes[r] != -2) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        res.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --remaining;
      }
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > deadline_s) {
      for (int r = 0; r < world; ++r)
        if (res.exit_codes[r] == -2) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          res.exit_codes[r] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void expect_all_ok(const std::string& scenario, int world) {
  RunResult r = launch(scenario, world);
  for (int i = 0; i < world; ++i)
    EXPECT_EQ(r.exit_codes[i], 0) << scenario << ": rank " << i << " of " << world
                                  << (r.exit_codes[i] == -1 ? " hung and was killed" : " failed");
}

// ---------------------------------------------------------------------------- child

void Child::compare(const std::string& what, const at::Tensor& actual, const at::Tensor& expected, double tol) {
  const double scale = expected.abs().max().item<double>();
  const double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  const double rel = scale > 0 ? diff / scale : diff;
  const bool ok = rel <= tol;
  if (world.rank() == 0 || !ok)
    std::printf("[rank %d] %-44s relative difference %.3g (tol %.0e) %s\n", world.rank(), what.c_str(), rel, tol,
                ok ? "ok" : "MISMATCH");
  if (!ok) ++failures;
}

void Child::fail(const std::string& what) {
  std::printf("[rank %d] FAILED: %s\n", world.rank(), what.c_str());
  ++failures;
}

Problem make_problem(const std::vector<std::vector<int64_t>>& shapes, int steps, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Problem p;
  for (const auto& s : shapes) p.params.push_back(at::randn(s, gen) * 0.5);
  for (int t = 0; t < steps; ++t) {
    std::vector<at::Tensor> g;
    for (const auto& s : shapes) g.push_back(at::randn(s, gen));
    p.grads.push_back(g);
  }
  return p;
}

int multiprocess_main(int argc, char** argv, const std::map<std::string, Scenario>& scenarios,
                      const std::function<std::chrono::seconds(const std::string&)>& timeout_of) {
  if (argc >= 3 && std::strcmp(argv[1], "--child") == 0) {
    const std::string name = argv[2];
    auto it = scenarios.find(name);
    if (it == scenarios.end()) {
      std::fprintf(stderr, "unknown scenario %s\n", name.c_str());
      return 2;
    }
    const auto timeout = timeout_of ? timeout_of(name) : std::chrono::seconds(60);
    Child c(comm::Group::init_from_env({timeout}));
    try {
      it->second(c);
    } catch (const std::exception& e) {
      std::printf("[rank %d] exception: %s\n", c.world.rank(), e.what());
      return 1;
    }
    return c.failures == 0 ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace dion::testing
