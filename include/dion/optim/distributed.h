// dion/optim/distributed.h — the optimizer's Distribution over dion_comm groups: DDP, FSDP,
// FSDP x TP, HSDP.
//
// API summary
//   auto world = dion::comm::Group::init_from_env();
//   auto dist = std::make_shared<dion::Distributed>(std::make_shared<dion::comm::Group>(world));
//   dist->overlap(3);                                // megabatch tasks in flight (default 3)
//   dist->shard(w_local, {4096, 1024}, /*dim=*/0);   // FSDP: w_local is this rank's row chunk
//   opt.set_distribution(dist);                      // parameters not registered: replicated (DDP)
//   opt.step();
//
// Layouts (reference: megabatch_base.py; the assembly is src/optim/assembly.h):
//   replicated (DDP):  each rank orthogonalizes ceil(N / world) matrices of a megabatch of N,
//                      then one all_gather;
//   sharded (FSDP):    one all_to_all assembles whole matrices on their owner ranks (every
//                      shard zero-padded to ceil(global / world) along the sharded dim, so
//                      uneven and empty shards work), orthogonalize, one all_to_all back;
//   HSDP:              give the shard sub-group (mesh.axis("fs")) and replicate(mesh.axis("dp"));
//                      gradients must already be reduced over the replicate axis unless the
//                      optimizer syncs them;
//   batch-sharded 3-D+ and num_heads: whole matrices on every rank, no communication; so are
//                      expert stacks split over their own EP group (shard_over, distribution.h).
// Sharding follows FSDP2 (dion/comm/chunks.h). Errors: see dion/optim/distribution.h.
#pragma once

#include <memory>

#include "dion/comm/group.h"
#include "dion/optim/distribution.h"

namespace dion {

// One dion_comm group as an axis of a Distribution.
class GroupAxis : public AxisGroup {
 public:
  explicit GroupAxis(std::shared_ptr<comm::Group> group) : group_(std::move(group)) {}
  int size() const override { return group_->size(); }
  int rank() const override { return group_->rank(); }
  std::string name() const override { return group_->name(); }
  c10::Device control_device() const override { return group_->control_device(); }
  void all_reduce_(at::Tensor& x) override { group_->all_reduce_(x); }
  at::Tensor all_gather(const at::Tensor& x) override { return group_->all_gather(x); }
  at::Tensor all_to_all(const at::Tensor& x) override { return group_->all_to_all(x); }
  comm::Group& group() const { return *group_; }

 private:
  std::shared_ptr<comm::Group> group_;
};

class Distributed : public Distribution {
 public:
  // `sync_gradients`: the optimizer averages unsynchronized gradients over `group` (DDP without
  // a gradient all-reduce; legacy Dion then syncs only its compressed P and R).
  explicit Distributed(std::shared_ptr<comm::Group> group, bool sync_gradients = false);
  // 2-D sharding (FSDP x TP): `outer` shards one matrix dim (mesh.axis("fs")), `inner` the other
  // (mesh.axis("tp")). Register parameters with shard(local, global_shape, dim, inner_dim).
  Distributed(std::shared_ptr<comm::Group> outer, std::shared_ptr<comm::Group> inner);

  // HSDP / legacy Dion's replicate mesh (see Distribution::replicate).
  Distributed& replicate(std::shared_ptr<comm::Group> replicate, bool sync_gradients);
  Distributed& overlap(int k) {
    Distribution::overlap(k);
    return *this;
  }

  comm::Group& group() { return *group_; }

 private:
  std::shared_ptr<comm::Group> group_;
};

}  // namespace dion
