// dion/comm/group.h — a process group over c10d, with async collectives and communication
// accounting. Part of dion_comm, which knows nothing of the optimizer.
//
// API summary
//   auto world = dion::comm::Group::init_from_env();   // torchrun variables, or one process
//   world.rank(); world.size(); world.local_rank();
//   auto sub = world.subgroup({0, 2}, "dp0");         // every rank calls, members get a group
//   sub->all_gather(x); sub->all_to_all(x); sub->all_reduce_(x); sub->broadcast_(x, 0);
//   dion::comm::Work w = sub->all_to_all_async(x);    // issue now ...
//   at::Tensor y = w.wait();                           // ... wait later (work.h)
//   world.stats();                                     // bytes and calls per collective kind
//   auto g = dion::comm::Group::from_process_group(pg, ranks); // torch's ProcessGroup
//
// Backends: Gloo for CPU tensors; NCCL for CUDA tensors (built with CUDA; the NCCL backend is
// created by the first collective on a CUDA tensor). A wrapped torch ProcessGroup uses its own
// backend for the tensor's device (a NCCL-only group serves CUDA tensors; a CPU tensor on it is a
// CommError naming the group).
// Rendezvous: a c10d TCPStore at MASTER_ADDR:MASTER_PORT, as torchrun sets up; rank 0 hosts it.
// Every collective waits at most the group's timeout; a rank that died makes the others throw
// dion::comm::CommError naming the collective, the group and the timeout, never hang.
// Blocking collectives are the async ones followed by wait(); collectives of one group are
// issued in program order, and every rank must issue the same ones in the same order.
//
// Sizes: a Group of size 1 needs no backend and its collectives are local copies.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <c10/core/Device.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dion/comm/work.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace dion::comm {

// Bytes this rank sent and calls it made, per collective kind ("all_gather", "all_to_all", ...).
struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, Entry> by_kind;
  int64_t bytes(const std::string& kind) const;
  int64_t calls(const std::string& kind) const;
  int64_t total_bytes() const;
  void clear() { by_kind.clear(); }
};

struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // every collective
  // How long create() / init_from_env() wait for all ranks to arrive; then every rank that is
  // there throws CommError saying how many of how many arrived.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};
  // A launcher serves the store at MASTER_ADDR:MASTER_PORT (torchrun's agent store,
  // TORCHELASTIC_USE_AGENT_STORE=True): rank 0 connects as a client instead of listening, and
  // every key goes under store_prefix (init_from_env: "dion/attempt_<TORCHELASTIC_RESTART_COUNT>",
  // so a restart never reads the keys of an earlier attempt in the same store).
  bool agent_store = false;
  std::string store_prefix{};
};

class Group {
 public:
  // One process, no backend.
  Group();

  // From torchrun's variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Without
  // RANK and WORLD_SIZE (or WORLD_SIZE=1): one process; one of the two without the other is an
  // error (a half-set torchrun environment). Every value is range-checked: WORLD_SIZE >= 1,
  // 0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK < WORLD_SIZE (default: RANK), 1 <= MASTER_PORT <=
  // 65535, MASTER_ADDR not empty; a missing or bad one throws CommError naming the variable, its
  // value and the valid range.
  static Group init_from_env(GroupOptions options = {});

  // Explicit rendezvous: rank 0 hosts the TCPStore at host:port; every rank counts itself in
  // and waits for all `size`. After options.rendezvous_timeout every waiting rank throws
  // CommError naming host:port and how many of the ranks arrived (even when something on that
  // port accepts the connection but never answers, where torch's TCPStore client would wait
  // forever); a rank number that arrives twice is an error on the second.
  static Group create(const std::string& host, int port, int rank, int size, GroupOptions options = {});

  // Wrap an existing c10d ProcessGroup (torch.distributed's, e.g. from Python): collectives go
  // through its backend for the tensor's device (Gloo for CPU, NCCL for CUDA), in the order this
  // process issues them — the optimizer issues all of its collectives from one thread. `ranks`: the members' global ranks in group-rank order
  // (torch.distributed.get_process_group_ranks); empty means 0..size-1. `store`: the world's
  // store (torch.distributed.distributed_c10d._get_default_store()), which subgroup() needs for
  // its rendezvous; without it subgroup() throws CommError. The name is "torch:" + the group's
  // name.
  static Group from_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::vector<int> ranks = {},
                                  const c10::intrusive_ptr<c10d::Store>& store = {}, GroupOptions options = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  // LOCAL_RANK from init_from_env (device placement); 0 for a group of one, the rank otherwise.
  int local_rank() const { return local_rank_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // Global ranks of this group's members, in group-rank order.
  const std::vector<int>& ranks() const { return ranks_; }

  // A sub-group of the given global ranks. Every rank of this group calls it, in the same order
  // (members rendezvous; the others get nullptr).
  std::shared_ptr<Group> subgroup(const std::vector<int>& ranks, const std::string& name) const;

  // Where this group's small control tensors (flags, counts) live: CPU when the group can
  // reduce CPU tensors, else the current CUDA device (a NCCL-only torch group).
  c10::Device control_device() const;

  // ------------------------------------------------------------------ collectives (async)
  // Each returns a Work whose wait() gives the result. The input is not modified (all_reduce
  // and broadcast work in place on `x`, which must stay alive and untouched until the wait).
  // x [..] on every rank -> [size, ..] in group-rank order.
  Work all_gather_async(const at::Tensor& x);
  // x [size * c, ..] -> [size * c, ..]: chunk j of dim 0 goes to rank j; chunk i of the result
  // came from rank i.
  Work all_to_all_async(const at::Tensor& x);
  // Uneven all_to_all (expert parallelism's token exchange): rows [sum(send[<j]), +send[j]) of
  // x go to rank j; the result holds recv[i] rows from rank i, in rank order. send.size() ==
  // recv.size() == size(); recv must be what the peers send (exchange the counts first).
  Work all_to_all_async(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv);
  Work all_reduce_async(at::Tensor& x);  // sum, in place; x contiguous
  Work broadcast_async(at::Tensor& x, int root);

  // ------------------------------------------------------------------ blocking (async + wait)
  at::Tensor all_gather(const at::Tensor& x) { return all_gather_async(x).wait(); }
  at::Tensor all_to_all(const at::Tensor& x) { return all_to_all_async(x).wait(); }
  void all_reduce_(at::Tensor& x) { all_reduce_async(x).wait(); }
  void broadcast_(at::Tensor& x, int root) { broadcast_async(x, root).wait(); }
  void barrier();

  CommStats& stats() { return *stats_; }
  const CommStats& stats() const { return *stats_; }

 private:
  void count(const std::string& kind, const at::Tensor& sent);
  // The Work of a c10d call made by `issue` (errors at issue time are reported like wait's);
  // `sent` (if defined) is counted in stats() once the call was issued.
  template <typename Issue>
  Work launch(const std::string& kind, const at::Tensor& sent, const at::Tensor& result, Issue&& issue);

  struct Impl;  // the c10d store and backend (group.cpp)

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::string name_ = "world";
  std::vector<int> ranks_ = {0};
  GroupOptions options_;
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<CommStats> stats_ = std::make_shared<CommStats>();
  std::shared_ptr<std::mutex> stats_mutex_ = std::make_shared<std::mutex>();  // groups used from several threads
  // Sub-groups created so far (identical on every rank): makes each sub-group's rendezvous
  // prefix unique, so two meshes over one world never share a prefix.
  std::shared_ptr<int> subgroups_ = std::make_shared<int>(0);
};

}  // namespace dion::comm
