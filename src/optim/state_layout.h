// state_layout.h — where this rank's optimizer state tensors sit in the whole tensors
// (private to src/optim). One rule, used when the state is created (legacy Dion's Q shard), when
// a checkpoint is written (each tensor's global shape and this rank's offsets) and when it is
// read back at another layout.
//
// A parameter sharded over the outer axis (FSDP) holds the FSDP2 contiguous chunk of
// ceil(size / world) along its shard dim, likewise along its inner dim (TP); its momentum and
// variance share that box (StateLayout::PARAM). A NEURON tensor [.., m, 1] shares it except its
// last dim (1, whole). An OUTER_ROWS tensor [rows, r] is the whole matrix's low-rank basis
// (rows = m when the low-rank update works on M^T, else n), of which a sharded parameter keeps
// the outer chunk of rows. A SCALAR is 0-d. A parameter registered with shard_over (expert
// parallelism) is chunked along its shard dim over its own group instead of the outer axis.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dion/optim/algorithm.h"
#include "dion/optim/distribution.h"

namespace dion {

// A box inside a whole tensor: this rank's part.
struct Box {
  std::vector<int64_t> global, offset, size;
};

// Where this rank sits along each axis (size 1, rank 0 without a Distribution).
struct AxisPlace {
  int outer_size = 1, outer_rank = 0, inner_size = 1, inner_rank = 0;
};
AxisPlace axis_place(const Distribution* dist);

// Legacy Dion's Q rows: [start, start + length) of `rows`.
struct QRows {
  int64_t rows = 0, start = 0, length = 0;
};
QRows q_rows_of(const Layout& L, const AxisPlace& at);

// The box of a state tensor of layout `kind` (dion/optim/algorithm.h) of a parameter laid out as
// `L`; `q_rank`: an OUTER_ROWS tensor's column count r.
Box state_box(StateLayout kind, const Layout& L, const AxisPlace& at, int64_t q_rank);

}  // namespace dion
