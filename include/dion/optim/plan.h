// dion/optim/plan.h — how one megabatch is laid out and communicated (what a matrix driver asks;
// dion/optim/driver.h).
//
// A megabatch (same shape, same dtype parameters of one group) is whole and local, replicated
// across a group (DDP: the megabatch is split across the ranks), or sharded along one tensor
// dim (FSDP; a second dim under FSDP x TP). plan_for() mirrors the reference's _get_shard_info
// and megabatch paths, and refuses the layouts an algorithm cannot run on (naming the group,
// its algorithm and the shape). Not here: the collectives themselves (collectives.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dion/optim/distribution.h"
#include "dion/optim/options.h"

namespace dion {

struct Plan {
  Layout layout;
  int64_t heads = 0;         // > 1: per-head views, orthogonalized where they are
  bool communicate = false;  // false: orthogonalize the local tensors as they are
  int64_t comm_dim = 0;      // sharded: negative tensor dim the shards concatenate along
  int64_t world = 1;
  bool matrix_sharded() const { return communicate && layout.sharded(); }
  // Whether matrix dim `dim` (-2: rows, -1: columns) is split across ranks where the math sees
  // it: not for a flattened 3-D+ parameter sharded along a batch dim (whole matrices per rank).
  // splits(-1): each rank holds part of every row (NorMuon's per-neuron sums cross ranks).
  bool splits(int64_t dim) const { return matrix_sharded() && (comm_dim == dim || layout.two_d()); }
};

// The parameter's layout: the Distribution's, or whole and local without one.
Layout layout_of(const Distribution* dist, const at::Tensor& param);

// `batch_size` parameters of one megabatch of group `group` (its index, for messages) with
// options `o`, laid out as `layout` (its first parameter's) over `world` ranks (1 without a
// distribution): what Optimizer::step() computes once per megabatch, before any task runs. A
// refusal then throws before any algorithm's collective of the step, though after prepare()'s and
// the ranks' agreement check's (every rank holds the same layouts and communication options, and
// so refuses alike).
Plan plan_for(const Layout& layout, int64_t world, size_t batch_size, const Options& o, size_t group);

}  // namespace dion
