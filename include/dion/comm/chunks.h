// dion/comm/chunks.h — FSDP2 contiguous chunks: which slice of a tensor each rank of a group
// holds, and the collectives that gather the slices back or sum a whole tensor into them.
//
// API summary
//   dion::comm::Chunk c = dion::comm::shard_range(size, world, rank);  // [start, start + length)
//   at::Tensor mine = dion::comm::shard_tensor(full, dim, world, rank); // a contiguous copy
//   at::Tensor full = dion::comm::gather_tensor(group, mine, dim, global);  // collective
//   dion::comm::Work w = dion::comm::gather_tensor_async(group, mine, dim, global);
//   at::Tensor full2 = dion::comm::join_gathered(w.wait(), dim, global);
//   at::Tensor part = dion::comm::reduce_scatter(group, full_grad, dim);  // collective
//
// Chunking follows FSDP2: ceil(size / world) elements per rank along one dim; rank r holds
// [r * chunk, min((r + 1) * chunk, size)), possibly empty. Collectives zero-pad every chunk to
// ceil(size / world), so uneven and empty chunks travel in equal-sized messages.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "dion/comm/group.h"
#include "dion/comm/work.h"

namespace dion::comm {

struct Chunk {
  int64_t start = 0, length = 0;
};
// FSDP2 contiguous chunk of `size` elements held by `rank` of `world`.
Chunk shard_range(int64_t size, int world, int rank);

// This rank's chunk of `full` along `dim` (a contiguous copy).
at::Tensor shard_tensor(const at::Tensor& full, int64_t dim, int world, int rank);

// `t` zero-padded at the end of `dim` (negative counts from the end) to `size`; `t` itself when
// it has that size already.
at::Tensor pad_to(const at::Tensor& t, int64_t dim, int64_t size);

// Reassemble the full tensor from every rank's chunk along `dim` (collective over `group`).
at::Tensor gather_tensor(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size);
// The same in two halves: issue the all_gather (of a copy of `local`) ...
Work gather_tensor_async(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size);
// ... and join what its wait() returns ([W, ..chunk..]) into the full tensor.
at::Tensor join_gathered(const at::Tensor& all, int64_t dim, int64_t global_size);

// `full` [.., global, ..] (global along `dim`) -> this rank's chunk of the sum over the group's
// ranks: a reduce-scatter, as one all_to_all of zero-padded chunks and a sum in rank order
// (collective over `group`).
at::Tensor reduce_scatter(Group& group, const at::Tensor& full, int64_t dim);

}  // namespace dion::comm
