// assembly.h — the megabatch assembly (private to src/optim): N local matrices of one megabatch
// (whole, or shards) turned into their orthogonalized local parts, by assembling whole matrices
// on the ranks over the Distribution's per-axis collectives.
//
//   replicated (DDP):  each rank orthogonalizes its ceil(N / W) share; one all_gather returns
//                      every result (reference: megabatch_base.py);
//   sharded (FSDP):    one all_to_all assembles whole matrices on their owner ranks (every
//                      shard zero-padded to ceil(global / W) along the sharded dim, so uneven
//                      and empty shards work), orthogonalize, one all_to_all back;
//   2-D (FSDP x TP):   the same in two stages: over the inner (TP) axis along its dim, then over
//                      the outer (FSDP) axis along the other; orthogonalize; undo both.
// Written once against dion/optim/distribution.h: the c10d groups and the tests' in-process fake
// run these same lines.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "dion/optim/distribution.h"

namespace dion {

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
  // Dion2's exact global selection: for each of the N matrices, the places of its selected
  // slices along `order_dim` of the assembled (owner-major, zero-padded) matrix, in one process's
  // order ([k] int64, the same k for all). The orthogonalizer then sees exactly those k slices in
  // that order, as one process does, and its result goes back to those places. Empty: none.
  std::vector<at::Tensor> order;
  int64_t order_dim = 0;
};

// U: N same-shape local matrices laid out as `layout`. Returns the N orthogonalized local parts,
// stacked [N, ...].
at::Tensor assemble_and_orthogonalize(Distribution& dist, std::vector<at::Tensor> U, const Layout& layout,
                                      const OrthoRequest& request);

// Sum `x` over the ranks that hold shards of the same matrices (in place): both axes for 2-D
// sharding.
void sum_over_shards_(Distribution& dist, at::Tensor& x);

}  // namespace dion
