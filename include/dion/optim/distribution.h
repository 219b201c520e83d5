// dion/optim/distribution.h — the optimizer's view of where parameters live.
//
// The optimizer's communication interface. The algorithm drivers never call c10d or a process
// group: when parameters are replicated (DDP) or sharded (FSDP, TP, HSDP) across ranks, the
// training program gives the optimizer a Distribution (dion/dist/distributed.h implements one
// over dion_comm's groups). The optimizer asks it:
//   layout(param):    the parameter's global shape and which tensor dim is sharded (if any);
//   orthogonalize():  turn N local matrices (whole, or shards) into their orthogonalized local
//                     parts — possibly by assembling whole matrices on other ranks;
//   plain collectives over one axis (legacy Dion's P/R traffic, Dion2's norm gathers, NorMuon's
//   shard-summed norms), and how many megabatch tasks may be in flight.
// Without a Distribution every parameter is whole and local.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "dion/math/ortho.h"

namespace dion {

struct Layout {
  std::vector<int64_t> global_shape;  // the whole parameter's shape
  int64_t shard_dim = -1;             // tensor dim sharded across the (outer, FSDP) group; -1: none
  bool replicated = false;            // whole on every rank of a group of size > 1 (DDP)
  int64_t inner_dim = -1;             // a second tensor dim sharded across the inner (TP) group
  bool sharded() const { return shard_dim >= 0; }
  bool two_d() const { return inner_dim >= 0; }
};

// What to do to the assembled matrices of one megabatch.
struct OrthoRequest {
  // Applied to a stack of whole matrices [n, *param_shape]: by default the orthogonalizer
  // (flatten / split_sizes handled inside); Dion2's global selection wraps it.
  std::function<at::Tensor(const at::Tensor&)> apply;
  // Sharded layouts: the dim (negative, of the stacked tensor) the shards concatenate along,
  // the global size along it, and an explicit per-rank size (Dion2's local selection of k rows)
  // or 0 for ceil(global / world).
  int64_t comm_dim = 0;
  int64_t global_size = 0;
  int64_t local_size = 0;
  // 2-D sharding: the same along the inner (TP) dim (Dion2's selection along that dim), or 0.
  int64_t inner_local_size = 0;
};

// The groups a Distribution spans: OUTER shards (FSDP, or the DDP group), INNER shards (TP),
// REPLICA (HSDP's replicate axis, when there is one; average_over_replicas_ falls back to OUTER
// for DDP).
enum class Axis { OUTER, INNER, REPLICA };

class Distribution {
 public:
  virtual ~Distribution() = default;

  // Plain collectives over one axis, for algorithms that orchestrate their own communication
  // (legacy Dion). An axis this Distribution lacks has size 1 and local no-op collectives.
  virtual int axis_size(Axis axis) const = 0;
  virtual int axis_rank(Axis axis) const = 0;
  virtual void all_reduce_(at::Tensor& x, Axis axis) = 0;            // sum, in place
  virtual at::Tensor all_gather(const at::Tensor& x, Axis axis) = 0;  // [size, ...]
  virtual at::Tensor all_to_all(const at::Tensor& x, Axis axis) = 0;  // dim-0 chunks
  virtual Layout layout(const at::Tensor& param) const = 0;
  // U: N same-shape local matrices. Returns the N orthogonalized local parts, stacked [N, ...].
  virtual at::Tensor orthogonalize(std::vector<at::Tensor> U, const Layout& layout,
                                   const OrthoRequest& request) = 0;
  // Sum `x` over the ranks that hold shards of the same matrices (in place): both groups for
  // 2-D sharding.
  virtual void sum_over_shards_(at::Tensor& x) = 0;
  // Every outer-group member's `x` (same shape everywhere), stacked [world, ...] in rank order.
  virtual at::Tensor gather_over_shards(const at::Tensor& x) = 0;
  virtual int rank() const = 0;

  // Data-parallel gradient synchronization by the optimizer (the reference Dion's
  // replicate_mesh_grad_sync): when true, gradients arrive unsynchronized and the optimizer
  // averages them over the replicas — legacy Dion averages only its low-rank P and R when that
  // is cheaper ("compressed" sync, decoupled momentum). Default: gradients already synchronized.
  virtual bool sync_gradients() const { return false; }
  // Average `x` over the replicas (in place).
  virtual void average_over_replicas_(at::Tensor& x) = 0;
  virtual int world_size() const = 0;

  // Called by the optimizer at the start of every step, on every rank, before any task runs
  // (one-time checks and set-up that are themselves collective).
  virtual void prepare() {}
  // Overlap: up to tasks_in_flight() megabatch tasks in flight at once, all on the calling
  // thread (dion/comm/tasks.h): a task that waits for a collective yields to the others, in a
  // fixed order, so that one task's collectives overlap another's computation while every rank
  // still issues the same collectives in the same order.
  virtual int tasks_in_flight() const { return 1; }
};

}  // namespace dion
