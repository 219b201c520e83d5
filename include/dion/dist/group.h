// dion/dist/group.h — a process group over c10d, with communication accounting.
//
// API summary
//   auto world = dion::dist::Group::init_from_env();   // torchrun variables, or one process
//   world.rank(); world.size();
//   auto sub = world.subgroup({0, 2}, "dp0");         // every rank calls, members get a group
//   sub->all_gather(x); sub->all_to_all(x); sub->all_reduce_(x); sub->broadcast_(x, 0);
//   world.stats();                                     // bytes and calls per collective kind
//   auto g = dion::dist::Group::from_process_group(pg, ranks); // wrap a torch ProcessGroup
//
// Backends: Gloo for CPU tensors; NCCL for CUDA tensors (built with CUDA; the NCCL backend is
// created by the first collective on a CUDA tensor).
// Rendezvous: a c10d TCPStore at MASTER_ADDR:MASTER_PORT, as torchrun sets up; rank 0 hosts it.
// Every collective waits at most the group's timeout; a rank that died makes the others throw
// dion::dist::CommError naming the collective, the group and the timeout, never hang.
//
// Sizes: a Group of size 1 needs no backend and its collectives are local copies.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace dion::dist {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class Group {
 public:
  // One process, no backend.
  Group();

  // From torchrun's variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK is read by
  // the caller for device placement). Without WORLD_SIZE (or WORLD_SIZE=1): one process.
  // Throws CommError naming the variable when one is missing or malformed.
  static Group init_from_env(GroupOptions options = {});

  // Explicit rendezvous: rank 0 hosts the TCPStore at host:port.
  static Group create(const std::string& host, int port, int rank, int size, GroupOptions options = {});

  // Wrap an existing c10d ProcessGroup (torch.distributed's, e.g. from Python): collectives go
  // through its CPU backend (Gloo). `ranks`: the members' global ranks in group-rank order
  // (torch.distributed.get_process_group_ranks); empty means 0..size-1. `store`: the world's
  // store (torch.distributed.distributed_c10d._get_default_store()), which subgroup() needs for
  // its rendezvous; without it subgroup() throws CommError. The name is "torch:" + the group's
  // name. Throws CommError when the group has no CPU backend.
  static Group from_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                  std::vector<int> ranks = {},
                                  const c10::intrusive_ptr<c10d::Store>& store = {},
                                  GroupOptions options = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // Global ranks of this group's members, in group-rank order.
  const std::vector<int>& ranks() const { return ranks_; }

  // A sub-group of the given global ranks. Every rank of this group calls it, in the same order
  // (members rendezvous; the others get nullptr).
  std::shared_ptr<Group> subgroup(const std::vector<int>& ranks, const std::string& name) const;

  // ------------------------------------------------------------------ collectives (blocking)
  // x [..] on every rank -> [size, ..] in group-rank order.
  at::Tensor all_gather(const at::Tensor& x);
  // x [size * c, ..] -> [size * c, ..]: chunk j of dim 0 goes to rank j; chunk i of the result
  // came from rank i.
  at::Tensor all_to_all(const at::Tensor& x);
  void all_reduce_(at::Tensor& x);  // sum, in place
  void broadcast_(at::Tensor& x, int root);
  void barrier();

  CommStats& stats() { return *stats_; }
  const CommStats& stats() const { return *stats_; }

 private:
  void count(const std::string& kind, const at::Tensor& sent);
  [[noreturn]] void fail(const std::string& kind, const std::exception& e) const;

  struct Impl;  // the c10d store and backend (group.cpp)

  int rank_ = 0, size_ = 1;
  std::string name_ = "world";
  std::vector<int> ranks_ = {0};
  GroupOptions options_;
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<CommStats> stats_ = std::make_shared<CommStats>();
  std::shared_ptr<std::mutex> stats_mutex_ = std::make_shared<std::mutex>();  // lanes count concurrently
  // Sub-groups created so far (identical on every rank): makes each sub-group's rendezvous
  // prefix unique, so two meshes over one world never share a prefix.
  std::shared_ptr<int> subgroups_ = std::make_shared<int>(0);
};

}  // namespace dion::dist
