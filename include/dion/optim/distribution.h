// dion/optim/distribution.h — the optimizer's view of where parameters live.
//
// The optimizer's communication interface. The algorithm drivers never call c10d or a process
// group: when parameters are replicated (DDP) or sharded (FSDP, TP, HSDP) across ranks, the
// training program gives the optimizer a Distribution (dion/optim/distributed.h builds one over
// dion_comm's groups). It holds:
//   per-axis groups: the collectives of one mesh axis (AxisGroup; the only part an
//                    implementation provides: c10d groups, or the tests' in-process fake);
//   layouts:         each parameter's global shape and which tensor dims are sharded (shard());
//   lifecycle:       the one-time collective check of the layouts (prepare()), how many megabatch
//                    tasks may be in flight, whether the optimizer synchronizes the gradients.
// The communication patterns built on these (the megabatch assembly, legacy Dion's P and R
// traffic, Dion2's norm gathers) belong to the optimizer (src/optim/assembly.h,
// dion/optim/collectives.h). Without a Distribution every parameter is whole and local.
//
// API summary
//   auto dist = std::make_shared<dion::Distribution>(outer, inner);   // AxisGroups; inner may be null
//   dist->replicate(dp, /*sync_gradients=*/false);     // HSDP's replicate axis
//   dist->overlap(3);                                  // megabatch tasks in flight
//   dist->shard(w_local, {4096, 1024}, /*dim=*/0);     // FSDP: w_local is this rank's row chunk
//   dist->shard_over(ep, w1_local, {E, 4096, 1024}, 0); // expert parallelism: experts split over `ep`
//   opt.set_distribution(dist);                        // parameters not registered: replicated (DDP)
//
// Sharding follows FSDP2 (dion/comm/chunks.h): contiguous chunks of ceil(size / world) along one
// dim; rank r holds [r * chunk, min((r + 1) * chunk, size)), possibly empty.
// Errors: shard specs are checked at the first step (prepare(), also run by init_state()) with
// one all_reduce per axis and per shard_over group, so a bad spec on any rank raises
// dion::ValueError on every rank (never one rank throwing while the others wait).
//
// Expert parallelism (shard_over): an MoE's expert stacks [E, out, in] split along a batch dim
// over their own group (the EP group), which need not be the outer one. Whole matrices on every
// rank: orthogonalized where they are, with no collective; a matrix dim split over the group is
// assembled over it, as FSDP over the outer group (flatten refused). The optimizer never averages
// their gradients or state over the outer group (with sync_gradients they are left as they arrive,
// or averaged over replicate()'s axis like FSDP shards). Every member of an EP group registers
// parameters over it, the groups in the same order on every rank (verify() reduces over each).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace dion {

class AxisGroup;

struct Layout {
  std::vector<int64_t> global_shape;  // the whole parameter's shape
  int64_t shard_dim = -1;             // tensor dim sharded across the (outer, FSDP) group; -1: none
  bool replicated = false;            // whole on every rank of a group of size > 1 (DDP)
  int64_t inner_dim = -1;             // a second tensor dim sharded across the inner (TP) group
  // shard_over(): shard_dim is split across this group (expert parallelism), not the outer one.
  // Owned by the Distribution; null: the outer group.
  AxisGroup* group = nullptr;
  bool sharded() const { return shard_dim >= 0; }
  bool two_d() const { return inner_dim >= 0; }
  bool own_group() const { return group != nullptr; }
};

// The groups a Distribution spans: OUTER shards (FSDP, or the DDP group), INNER shards (TP),
// REPLICA (HSDP's replicate axis, when there is one; average_over_replicas_ falls back to OUTER
// for DDP).
enum class Axis { OUTER, INNER, REPLICA };

// The collectives of one mesh axis. Every member issues the same collectives in the same order;
// inside a cooperative task (dion/comm/tasks.h) a collective may yield to the other tasks while
// it waits.
class AxisGroup {
 public:
  virtual ~AxisGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual std::string name() const = 0;
  virtual c10::Device control_device() const = 0;          // where small control tensors live
  virtual void all_reduce_(at::Tensor& x) = 0;             // sum, in place
  virtual at::Tensor all_gather(const at::Tensor& x) = 0;  // [size, ...] in group-rank order
  virtual at::Tensor all_to_all(const at::Tensor& x) = 0;  // dim-0 chunk j to member j
};

class Distribution {
 public:
  // `outer`: the FSDP shard group, or the DDP group; `inner`: the TP group of 2-D sharding (FSDP x
  // TP), or null. `sync_gradients`: see sync_gradients().
  explicit Distribution(std::shared_ptr<AxisGroup> outer, std::shared_ptr<AxisGroup> inner = nullptr,
                        bool sync_gradients = false);
  virtual ~Distribution() = default;

  // HSDP / legacy Dion's replicate mesh: average over `replicate` (the optimizer averages the
  // gradients, or only Dion's compressed P and R, when `sync_gradients`).
  Distribution& replicate(std::shared_ptr<AxisGroup> replicate, bool sync_gradients);
  // Megabatch tasks in flight at once, all on the calling thread (dion/comm/tasks.h): a task that
  // waits for a collective yields to the others, in a fixed order, so that one task's
  // collectives overlap another's computation while every rank still issues the same
  // collectives in the same order. 1: one task at a time.
  Distribution& overlap(int k);

  // Register a sharded parameter: `local` holds this rank's chunk of a tensor of `global_shape`
  // along `dim` over the outer group (and along `inner_dim` over the inner group when >= 0).
  // Unregistered parameters are replicated across the outer group.
  void shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim, int64_t inner_dim = -1);
  // Register a parameter split over its own `group` (expert parallelism: an [E, out, in] stack
  // split along dim 0 over the EP group): `local` holds this rank's FSDP2 chunk along `dim` of a
  // tensor of `global_shape` over `group`. A batch dim: whole matrices, no collective; a matrix
  // dim: assembled over `group` (Optimizer::step); flatten refused at the step. A null group throws.
  void shard_over(std::shared_ptr<AxisGroup> group, const at::Tensor& local, std::vector<int64_t> global_shape,
                  int64_t dim);
  // The parameter's layout (not collective: the shard specs are checked in prepare()).
  Layout layout(const at::Tensor& param) const;

  // Per-axis collectives. An axis this Distribution lacks has size 1 and local no-op collectives.
  AxisGroup* axis(Axis axis) const;  // null when absent
  int axis_size(Axis axis) const;
  int axis_rank(Axis axis) const;
  void all_reduce_(at::Tensor& x, Axis axis);             // sum, in place
  at::Tensor all_gather(const at::Tensor& x, Axis axis);  // [size, ...]
  at::Tensor all_to_all(const at::Tensor& x, Axis axis);  // dim-0 chunks
  int rank() const { return axis_rank(Axis::OUTER); }
  int world_size() const { return axis_size(Axis::OUTER); }

  // Data-parallel gradient synchronization by the optimizer (the reference Dion's
  // replicate_mesh_grad_sync): when true, gradients arrive unsynchronized and the optimizer
  // averages them over the replicas — legacy Dion averages only its low-rank P and R when that
  // is cheaper ("compressed" sync, decoupled momentum). Default: gradients already synchronized.
  bool sync_gradients() const { return sync_gradients_; }
  // Average `x` over the replicas (in place): the replicate axis, else the outer (DDP) group.
  void average_over_replicas_(at::Tensor& x);

  // Called by the optimizer at the start of every step, on every rank, before any task runs:
  // the one-time collective check of the shard specs.
  void prepare();
  int tasks_in_flight() const { return in_flight_; }

 private:
  void verify() const;  // collective, once: every rank agrees the shard specs are valid

  std::shared_ptr<AxisGroup> outer_;
  std::shared_ptr<AxisGroup> inner_;                    // TP group for 2-D sharding, or null
  std::shared_ptr<AxisGroup> replicate_;                // HSDP replicate group, or null (DDP: the outer group)
  std::vector<std::shared_ptr<AxisGroup>> own_groups_;  // shard_over's groups, in registration order
  int in_flight_ = 1;
  bool sync_gradients_ = false;
  std::unordered_map<const void*, Layout> layouts_;
  mutable std::string local_error_;
  mutable bool verified_ = false;
};

}  // namespace dion
