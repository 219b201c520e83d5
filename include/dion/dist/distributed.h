// dion/dist/distributed.h — the optimizer's Distribution over dion_comm groups: DDP, FSDP, FSDP x TP, HSDP.
//
// API summary
//   auto world = dion::comm::Group::init_from_env();
//   auto dist = std::make_shared<dion::dist::Distributed>(std::make_shared<Group>(world));
//   dist->overlap(3);                                // megabatch tasks in flight (default 3)
//   dist->shard(w_local, {4096, 1024}, /*dim=*/0);   // FSDP: w_local is this rank's row chunk
//   opt.set_distribution(dist);                      // parameters not registered: replicated (DDP)
//   opt.step();
//
// Layouts (reference: megabatch_base.py):
//   replicated (DDP):  each rank orthogonalizes ceil(N / world) matrices of a megabatch of N,
//                      then one all_gather;
//   sharded (FSDP):    one all_to_all assembles whole matrices on their owner ranks (every
//                      shard zero-padded to ceil(global / world) along the sharded dim, so
//                      uneven and empty shards work), orthogonalize, one all_to_all back;
//   HSDP:              give the shard sub-group (mesh.axis("fs")); gradients must already be
//                      reduced over the replicate axis;
//   batch-sharded 3-D+ and num_heads: whole matrices on every rank, no communication.
// Sharding follows FSDP2: contiguous chunks of ceil(size / world) along one dim; rank r holds
// [r * chunk, min((r + 1) * chunk, size)), possibly empty.
//
// Errors: shard specs are checked at the first step (prepare(), also run by init_state()) with
// one all_reduce, so a bad spec on any rank raises dion::ValueError on every rank (never one rank
// throwing while the others wait).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dion/comm/group.h"
#include "dion/optim/distribution.h"

namespace dion::dist {

// The communication types, by their old names (they live in dion_comm).
using comm::CommError;
using comm::CommStats;
using comm::Group;
using comm::GroupOptions;

struct Chunk {
  int64_t start = 0, length = 0;
};
// FSDP2 contiguous chunk of `size` elements held by `rank` of `world`.
Chunk shard_range(int64_t size, int world, int rank);

// This rank's chunk of `full` along `dim` (a contiguous copy).
at::Tensor shard_tensor(const at::Tensor& full, int64_t dim, int world, int rank);

// Reassemble the full tensor from every rank's chunk along `dim` (collective over `group`).
at::Tensor gather_tensor(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size);
// The same in two halves: issue the all_gather (of a copy of `local`) ...
comm::Work gather_tensor_async(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size);
// ... and join what its wait() returns ([W, ..chunk..]) into the full tensor.
at::Tensor join_gathered(const at::Tensor& all, int64_t dim, int64_t global_size);

class Distributed : public Distribution {
 public:
  // `sync_gradients`: the optimizer averages unsynchronized gradients over `group` (DDP without
  // a gradient all-reduce; legacy Dion then syncs only its compressed P and R).
  explicit Distributed(std::shared_ptr<Group> group, bool sync_gradients = false);

  // Megabatch tasks in flight at once (the reference runs 3), all on the calling thread and
  // over the given groups (dion/comm/tasks.h). 1: one task at a time.
  Distributed& overlap(int k);

  // 2-D sharding (FSDP x TP): `outer` shards one matrix dim (mesh.axis("fs")), `inner` the other
  // (mesh.axis("tp")). Register parameters with shard(local, global_shape, dim, inner_dim).
  Distributed(std::shared_ptr<Group> outer, std::shared_ptr<Group> inner);

  // HSDP / legacy Dion's replicate mesh: average over `replicate` (the optimizer averages the
  // gradients, or only Dion's compressed P and R, when `sync_gradients`).
  Distributed& replicate(std::shared_ptr<Group> replicate, bool sync_gradients);

  int axis_size(Axis axis) const override;
  int axis_rank(Axis axis) const override;
  void all_reduce_(at::Tensor& x, Axis axis) override;
  at::Tensor all_gather(const at::Tensor& x, Axis axis) override;
  at::Tensor all_to_all(const at::Tensor& x, Axis axis) override;

  // Register a sharded parameter: `local` holds this rank's chunk of a tensor of `global_shape`
  // along `dim`. Unregistered parameters are replicated across the group.
  void shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim,
             int64_t inner_dim = -1);

  Layout layout(const at::Tensor& param) const override;
  at::Tensor orthogonalize(std::vector<at::Tensor> U, const Layout& layout,
                           const OrthoRequest& request) override;
  void sum_over_shards_(at::Tensor& x) override;
  at::Tensor gather_over_shards(const at::Tensor& x) override { return outer().all_gather(x); }
  int rank() const override { return group_->rank(); }
  bool sync_gradients() const override { return sync_gradients_; }
  void average_over_replicas_(at::Tensor& x) override;
  int world_size() const override { return group_->size(); }
  void prepare() override;
  int tasks_in_flight() const override { return in_flight_; }

  Group& group() { return *group_; }

 private:
  void verify() const;  // collective, once: every rank agrees the shard specs are valid
  at::Tensor orthogonalize_sharded(Group& group, std::vector<at::Tensor> U, const OrthoRequest& request);
  at::Tensor orthogonalize_replicated(std::vector<at::Tensor> U, const OrthoRequest& request);

  Group& outer() { return *group_; }
  Group& inner() { return *inner_; }
  Group* axis_group(Axis axis);  // that axis's group, or null when absent
  const Group* axis_group(Axis axis) const;

  std::shared_ptr<Group> group_;
  std::shared_ptr<Group> inner_;  // TP group for 2-D sharding, or null
  std::shared_ptr<Group> replicate_;  // HSDP replicate group, or null (DDP: the outer group)
  int in_flight_ = 3;
  bool sync_gradients_ = false;
  std::unordered_map<const void*, Layout> layouts_;
  mutable std::string local_error_;
  mutable bool verified_ = false;
};

}  // namespace dion::dist
