// Process groups over c10d (see include/dion/comm/group.h): rendezvous, backends per device,
// async collectives returning a Work, byte/call accounting.
//
// Not here: waiting (work.cpp), task scheduling (tasks.cpp), meshes (mesh.cpp).
//
// Gloo's C++ header is not in the torch wheel; Debian's libgloo-dev supplies <gloo/*.h> so that
// ProcessGroupGloo.hpp compiles. We only construct the backend through its exported
// constructor and call the c10d::Backend interface, so the Gloo version of those headers does
// not matter for the layout of anything we touch.
#include "dion/comm/group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef DION_HAVE_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <sstream>
#include <thread>
#include <utility>

#include "dion/errors.h"
#include "work_state.h"

namespace dion::comm {

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;      // the world's TCPStore (shared by subgroups); for a
                                              // wrapped torch ProcessGroup, torch's store or null
  c10::intrusive_ptr<c10d::Backend> backend;  // this group's backend for CPU tensors (Gloo), or null
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // the wrapped torch ProcessGroup (kept alive), or null
  c10::intrusive_ptr<c10d::Backend> nccl;     // backend for CUDA tensors, found or created on first use
  std::string prefix;                         // rendezvous prefix of this group
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};

  // Gloo for CPU tensors, NCCL for CUDA tensors. Our own NCCL backend is created by the first
  // collective on a CUDA tensor, which every rank reaches at the same point; a wrapped torch
  // group lends its own backend for the device.
  c10d::Backend& backend_for(const at::Tensor& t, const std::string& group_name) {
    if (!t.is_cuda()) {
      if (!backend)
        throw CommError("group '" + group_name +
                        "' has no backend for CPU tensors (a torch group made with "
                        "backend='nccl' only: CPU parameters need 'gloo' or 'cpu:gloo,cuda:nccl')");
      return *backend;
    }
#ifdef DION_HAVE_CUDA
    if (!nccl) {
      if (pg) {
        try {
          nccl = pg->getBackend(c10::DeviceType::CUDA);
        } catch (const std::exception& e) {
          throw CommError("group '" + group_name +
                          "' has no backend for CUDA tensors (create it with "
                          "backend='nccl' or 'cpu:gloo,cuda:nccl'): " +
                          dion::message_of(e));
        }
      } else {
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = timeout;
        auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix + "/nccl", store);
        nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
      }
    }
    return *nccl;
#else
    throw CommError("group '" + group_name + "': a CUDA tensor, but dion-cpp was built without CUDA (no NCCL backend)");
#endif
  }
};

int64_t CommStats::bytes(const std::string& kind) const {
  auto it = by_kind.find(kind);
  return it == by_kind.end() ? 0 : it->second.bytes;
}
int64_t CommStats::calls(const std::string& kind) const {
  auto it = by_kind.find(kind);
  return it == by_kind.end() ? 0 : it->second.calls;
}
int64_t CommStats::total_bytes() const {
  int64_t total = 0;
  for (const auto& [k, e] : by_kind) total += e.bytes;
  return total;
}

Group::Group() = default;

namespace {
// An integer environment variable in [lo, hi]; `fallback` when unset (or a CommError naming the
// variable when it is required). Errors name the variable, its value and the valid range.
int env_int(const char* name, bool required, int fallback, long lo, long hi, const std::string& range) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required)
      throw CommError(std::string("environment variable ") + name +
                      " is not set (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
    return fallback;
  }
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    throw CommError(std::string("environment variable ") + name + "='" + v + "' is invalid: it must be an integer " +
                    range);
  return static_cast<int>(x);
}
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}
}  // namespace

Group Group::init_from_env(GroupOptions options) {
  const char* rank_env = std::getenv("RANK");
  const char* size_env = std::getenv("WORLD_SIZE");
  const bool has_rank = rank_env && *rank_env, has_size = size_env && *size_env;
  if (has_rank != has_size)
    throw CommError(std::string("environment variable ") + (has_rank ? "RANK" : "WORLD_SIZE") + "='" +
                    (has_rank ? rank_env : size_env) + "' is set but " + (has_rank ? "WORLD_SIZE" : "RANK") +
                    " is not: set both (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) "
                    "or neither for one process");
  const int size = env_int("WORLD_SIZE", false, 1, 1, INT_MAX, ">= 1");
  const std::string ranks = "in [0, WORLD_SIZE - 1] = [0, " + std::to_string(size - 1) + "]";
  const int rank = env_int("RANK", size > 1, 0, 0, size - 1, ranks);
  const int local_rank = env_int("LOCAL_RANK", false, rank, 0, size - 1, ranks);
  if (size <= 1) {
    Group g;
    g.options_ = options;
    return g;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr)
    throw CommError("environment variable MASTER_ADDR is not set (the host of rank 0, e.g. 127.0.0.1)");
  const int port = env_int("MASTER_PORT", true, 0, 1, 65535, "in [1, 65535]");
  if (const char* a = std::getenv("TORCHELASTIC_USE_AGENT_STORE"); a && std::string(a) == "True") {
    options.agent_store = true;
    const char* n = std::getenv("TORCHELASTIC_RESTART_COUNT");
    options.store_prefix = std::string("dion/attempt_") + (n && *n ? n : "0");
  }
  Group g = create(addr, port, rank, size, options);
  g.local_rank_ = local_rank;
  return g;
}

Group Group::create(const std::string& host, int port, int rank, int size, GroupOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    std::ostringstream os;
    os << "invalid rank " << rank << " for world size " << size << " (need 0 <= rank < size)";
    throw CommError(os.str());
  }
  if (port < 1 || port > 65535)
    throw CommError("invalid port " + std::to_string(port) + " for the rendezvous at " + host + " (valid: 1 to 65535)");
  Group g;
  g.rank_ = rank;
  g.local_rank_ = rank;
  g.size_ = size;
  g.options_ = options;
  g.ranks_.resize(size);
  for (int i = 0; i < size; ++i) g.ranks_[i] = i;
  if (size == 1) return g;
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = rank == 0 && !options.agent_store;
  so.numWorkers = size;
  so.waitWorkers = false;  // the arrival count below waits, and can say how many came
  // The rendezvous timeout until everyone has arrived (a client's connection retries last that
  // long), the collective timeout after.
  so.timeout = options.rendezvous_timeout;
  g.impl_ = std::make_shared<Impl>();
  // The store and the Gloo backend over it; everything captured by value, nothing of `g`.
  using Rendezvous = std::pair<c10::intrusive_ptr<c10d::Store>, c10::intrusive_ptr<c10d::Backend>>;
  const auto deadline = std::chrono::steady_clock::now() + options.rendezvous_timeout;
  auto all_arrived = std::make_shared<std::atomic<bool>>(false);
  auto rendezvous = [host, port, so, rank, size, deadline, all_arrived, timeout = options.timeout,
                     rdv_ms = options.rendezvous_timeout.count(), sp = options.store_prefix]() -> Rendezvous {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(host, so);
    if (!sp.empty()) store = c10::make_intrusive<c10d::PrefixStore>(sp, store);
    if (store->add("dion/rendezvous/rank_" + std::to_string(rank), 1) > 1) {
      std::ostringstream os;
      os << "rank " << rank << " of " << size << ": another process with RANK=" << rank
         << " already joined the rendezvous at " << host << ":" << port
         << ": every rank of a job needs its own RANK in [0, " << size - 1 << "]";
      throw CommError(os.str());
    }
    int64_t arrived = store->add("dion/rendezvous/arrived", 1);
    while (arrived < size) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::ostringstream os;
        os << "rank " << rank << " of " << size << ": only " << arrived << " of " << size
           << " ranks arrived at the rendezvous " << host << ":" << port << " within " << rdv_ms << " ms: start all "
           << size << " (WORLD_SIZE) with the same MASTER_ADDR and MASTER_PORT, e.g. "
           << "torchrun --nproc_per_node " << size << " or dion-train --nproc " << size;
        throw CommError(os.str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      arrived = store->add("dion/rendezvous/arrived", 0);
    }
    all_arrived->store(true);
    store->setTimeout(timeout);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("world", store);
    return {store, make_gloo(prefixed, rank, size, timeout)};
  };
  try {
    Rendezvous r;
    if (so.isServer) {
      // Rank 0 listens: its waits are bounded by torch's own timeout.
      r = rendezvous();
    } else {
      // A client's TCPStore constructor ignores the timeout once the TCP handshake succeeds: a
      // port held by a process that accepts but never answers would block this rank for as long
      // as that process lives. So the connection runs on its own thread, bounded by our deadline.
      std::promise<Rendezvous> done;
      std::future<Rendezvous> result = done.get_future();
      std::thread connect([rendezvous, done = std::move(done)]() mutable {
        try {
          done.set_value(rendezvous());
        } catch (...) {
          done.set_exception(std::current_exception());
        }
      });
      // Until every rank has counted itself in (bounded by the rendezvous timeout), then the
      // Gloo connections (bounded by the collective timeout).
      bool ready = result.wait_until(deadline + std::chrono::seconds(1)) == std::future_status::ready;
      if (!ready && all_arrived->load()) ready = result.wait_for(options.timeout) == std::future_status::ready;
      if (!ready) {
        // Deliberately left running: it owns everything it touches (captured by value, the
        // promise included) and blocks in a socket read we cannot cancel. The caller is failing
        // the start-up; the thread and its socket end with the process.
        connect.detach();
        std::ostringstream os;
        os << "rank " << rank << " of " << size << ": rendezvous at MASTER_ADDR:MASTER_PORT = " << host << ":" << port
           << " did not finish within the timeout of " << options.rendezvous_timeout.count()
           << " ms: is rank 0 running the same job? is another program listening on that port?";
        throw CommError(os.str());
      }
      connect.join();
      r = result.get();  // rethrows the construction's own exception, caught below
    }
    g.impl_->store = std::move(r.first);
    g.impl_->backend = std::move(r.second);
    g.impl_->prefix = "world";
    g.impl_->rank = rank;
    g.impl_->size = size;
    g.impl_->timeout = options.timeout;
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << "rank " << rank << " of " << size << ": rendezvous at " << host << ":" << port << " failed within "
       << options.timeout.count() << " ms: " << dion::message_of(e);
    throw CommError(os.str());
  }
  return g;
}

Group Group::from_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::vector<int> ranks,
                                const c10::intrusive_ptr<c10d::Store>& store, GroupOptions options) {
  if (!pg) throw CommError("from_process_group: the ProcessGroup is null");
  Group g;
  g.rank_ = pg->getRank();
  g.size_ = pg->getSize();
  g.options_ = options;
  std::string name;
  try {
    name = pg->getGroupName();
  } catch (const std::exception&) {
    // unnamed group: "torch:" alone
  }
  g.name_ = "torch:" + name;  // also the prefix of subgroup() rendezvous keys: apart from torch's
  if (ranks.empty()) {
    ranks.resize(g.size_);
    for (int i = 0; i < g.size_; ++i) ranks[i] = i;
  }
  if (static_cast<int>(ranks.size()) != g.size_) {
    std::ostringstream os;
    os << "from_process_group: " << ranks.size() << " ranks given for a group of size " << g.size_;
    throw CommError(os.str());
  }
  g.ranks_ = std::move(ranks);
  g.local_rank_ = g.rank_;
  if (g.size_ == 1) return g;
  g.impl_ = std::make_shared<Impl>();
  g.impl_->pg = pg;
  g.impl_->store = store;
  {
    // Every wrapper of one torch group shares its sub-group count, so a second wrapper's
    // sub-groups get fresh rendezvous prefixes (ranks wrap groups in the same order).
    static std::mutex mutex;
    static std::map<std::string, std::shared_ptr<int>> counts;
    std::lock_guard<std::mutex> lock(mutex);
    auto& count = counts[g.name_];
    if (!count) count = std::make_shared<int>(0);
    g.subgroups_ = count;
  }
  for (const c10::Device& d : pg->getDeviceTypes())
    if (d.type() == c10::DeviceType::CPU) g.impl_->backend = pg->getBackend(c10::DeviceType::CPU);
  return g;
}

c10::Device Group::control_device() const {
  if (!impl_ || impl_->backend) return c10::Device(c10::DeviceType::CPU);
  return c10::Device(c10::DeviceType::CUDA);  // the current CUDA device
}

std::shared_ptr<Group> Group::subgroup(const std::vector<int>& ranks, const std::string& name) const {
  const int serial = (*subgroups_)++;  // every rank counts, member or not
  int my = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0) throw CommError("subgroup '" + name + "': invalid rank " + std::to_string(ranks[i]));
    if (ranks[i] == ranks_[rank_]) my = static_cast<int>(i);
  }
  if (my < 0) return nullptr;
  auto g = std::make_shared<Group>();
  g->rank_ = my;
  g->size_ = static_cast<int>(ranks.size());
  // The serial makes the name (and so every rendezvous prefix below it) unique, also for a
  // second mesh or lane set built over the same parent.
  g->name_ = name_ + "/" + name + "#" + std::to_string(serial);
  g->stats_mutex_ = stats_mutex_;
  g->ranks_ = ranks;
  g->options_ = options_;
  g->stats_ = stats_;  // one ledger per process: the world's
  if (g->size_ > 1) {
    if (!impl_) throw CommError("subgroup '" + name + "' of a single-process group");
    if (!impl_->store)
      throw CommError("subgroup '" + name + "' of group '" + name_ +
                      "', which wraps a torch ProcessGroup without a store: pass the world's store "
                      "to from_process_group, or create the sub-group in torch (dist.new_group) and wrap it");
    g->impl_ = std::make_shared<Impl>();
    g->impl_->store = impl_->store;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(g->name_, impl_->store);
    g->impl_->prefix = g->name_;
    g->impl_->rank = my;
    g->impl_->size = g->size_;
    g->impl_->timeout = options_.timeout;
    try {
      g->impl_->backend = make_gloo(prefixed, my, g->size_, options_.timeout);
    } catch (const std::exception& e) {
      throw CommError("creating group '" + g->name_ + "' failed: " + dion::message_of(e));
    }
  }
  return g;
}

// ---------------------------------------------------------------------------- collectives

void Group::count(const std::string& kind, const at::Tensor& sent) {
  std::lock_guard<std::mutex> lock(*stats_mutex_);
  auto& e = stats_->by_kind[kind];
  e.calls += 1;
  e.bytes += static_cast<int64_t>(sent.numel()) * static_cast<int64_t>(sent.element_size());
}

template <typename Issue>
Work Group::launch(const std::string& kind, const at::Tensor& sent, const at::Tensor& result, Issue&& issue) {
  auto state = std::make_shared<Work::State>();
  state->result = result;
  state->kind = kind;
  state->group = name_;
  state->rank = rank_;
  state->size = size_;
  state->timeout = options_.timeout;
  if (std::getenv("DION_TRACE_COLLECTIVES"))  // before the call: a hang inside it still shows
    std::fprintf(stderr, "[dion %s rank %d] %s %s\n", name_.c_str(), rank_, kind.c_str(),
                 c10::str((sent.defined() ? sent : result).sizes()).c_str());
  try {
    state->work = issue();
  } catch (const CommError&) {
    throw;  // already names the group (e.g. no backend for the tensor's device)
  } catch (const std::exception& e) {
    throw_comm_error(kind, name_, rank_, size_, options_.timeout, e);
  }
  if (sent.defined()) count(kind, sent);
  return Work(std::move(state));
}

Work Group::all_gather_async(const at::Tensor& x) {
  at::Tensor in = x.contiguous();
  if (size_ == 1) return Work::done(in.unsqueeze(0).clone());
  std::vector<int64_t> shape = {size_};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());  // [size, ..]
  return launch("all_gather", in, out, [&] {
    std::vector<at::Tensor> inputs = {in};
    std::vector<std::vector<at::Tensor>> outputs(1, out.unbind(0));
    return impl_->backend_for(in, name_).allgather(outputs, inputs);
  });
}

Work Group::all_to_all_async(const at::Tensor& x) {
  at::Tensor in = x.contiguous();
  if (size_ == 1) return Work::done(in.clone());
  TORCH_CHECK(in.size(0) % size_ == 0, "all_to_all on group '", name_, "': dim 0 (", in.size(0),
              ") must be a multiple of the group size (", size_, ")");
  at::Tensor out = at::empty_like(in);
  return launch("all_to_all", in, out, [&] {
    std::vector<int64_t> splits;  // empty: equal splits
    return impl_->backend_for(in, name_).alltoall_base(out, in, splits, splits);
  });
}

Work Group::all_to_all_async(const at::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& recv) {
  TORCH_CHECK(int(send.size()) == size_ && int(recv.size()) == size_, "all_to_all on group '", name_,
              "': split sizes for ", send.size(), " and ", recv.size(), " ranks, the group has ", size_);
  at::Tensor in = x.contiguous();
  int64_t sent = 0, received = 0;
  for (int i = 0; i < size_; ++i) sent += send[size_t(i)], received += recv[size_t(i)];
  TORCH_CHECK(in.dim() >= 1 && in.size(0) == sent, "all_to_all on group '", name_, "': dim 0 (",
              in.dim() ? in.size(0) : 0, ") must be the sum of the send splits (", sent, ")");
  if (size_ == 1) return Work::done(in.clone());
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = received;
  at::Tensor out = at::empty(shape, in.options());
  return launch("all_to_all", in, out, [&] {
    std::vector<int64_t> out_splits = recv, in_splits = send;
    return impl_->backend_for(in, name_).alltoall_base(out, in, out_splits, in_splits);
  });
}

Work Group::all_reduce_async(at::Tensor& x) {
  if (size_ == 1) return Work::done(x);
  TORCH_CHECK(x.is_contiguous(), "all_reduce_ on group '", name_, "' needs a contiguous tensor");
  return launch("all_reduce", x, x, [&] {
    std::vector<at::Tensor> ts = {x};
    return impl_->backend_for(x, name_).allreduce(ts);
  });
}

Work Group::broadcast_async(at::Tensor& x, int root) {
  if (size_ == 1) return Work::done(x);
  TORCH_CHECK(x.is_contiguous(), "broadcast_ on group '", name_, "' needs a contiguous tensor");
  TORCH_CHECK(root >= 0 && root < size_, "broadcast_ on group '", name_, "': root ", root, " is not in [0, ", size_,
              ")");
  return launch("broadcast", rank_ == root ? x : at::Tensor(), x, [&] {
    std::vector<at::Tensor> ts = {x};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return impl_->backend_for(x, name_).broadcast(ts, opts);
  });
}

void Group::barrier() {
  if (size_ == 1) return;
  // An all_reduce of one element on the control device (a barrier of the CPU backend, or of
  // NCCL for a NCCL-only group).
  at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(control_device()));
  launch("barrier", at::Tensor(), one, [&] {
    std::vector<at::Tensor> ts = {one};
    return impl_->backend_for(one, name_).allreduce(ts);
  }).wait();
}

}  // namespace dion::comm
