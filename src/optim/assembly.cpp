// The megabatch assembly over a Distribution's per-axis collectives (see assembly.h).
#include "assembly.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>

#include "dion/comm/chunks.h"
#include "dion/errors.h"

namespace dion {

namespace {

// What the last stage does to a stack of whole matrices; `ids`: their indices in the megabatch
// (-1: a zero matrix padding the megabatch to a multiple of the ranks).
using Apply = std::function<at::Tensor(const at::Tensor& whole, const std::vector<int64_t>& ids)>;

std::vector<int64_t> share(const std::vector<int64_t>& ids, size_t first, size_t count) {
  std::vector<int64_t> out;
  for (size_t j = first; j < first + count; ++j) out.push_back(j < ids.size() ? ids[j] : -1);
  return out;
}

// Each rank orthogonalizes its ceil(N / W) share; one all_gather returns every result.
at::Tensor orthogonalize_replicated(AxisGroup& group, std::vector<at::Tensor> U, const std::vector<int64_t>& ids,
                                    const Apply& apply) {
  const int W = group.size(), r = group.rank();
  const size_t N = U.size();
  const size_t per_rank = (N + W - 1) / W;
  while (U.size() < per_rank * W) U.push_back(at::zeros_like(U[0]));
  std::vector<at::Tensor> mine(U.begin() + r * per_rank, U.begin() + (r + 1) * per_rank);
  at::Tensor out = apply(at::stack(mine, 0), share(ids, r * per_rank, per_rank)).contiguous();  // [per_rank, ...]
  at::Tensor all = group.all_gather(out);                                                      // [W, per_rank, ...]
  return all.flatten(0, 1).narrow(0, 0, static_cast<int64_t>(N));
}

// One stage of the sharded assembly: along `dim`, `global` in all, each rank's part zero-padded
// to `local` (0: FSDP2's ceil(global / W)).
struct Stage {
  int64_t dim = 0, global = 0, local = 0;
};

// One all_to_all assembles whole matrices on their owners; orthogonalize; one all_to_all back.
// With FSDP2 chunking the padding sits at the end of the assembled dim (every rank before the
// last non-empty one holds a full chunk): the orthogonalizer sees the matrix without it, as one
// process does.
at::Tensor orthogonalize_sharded(AxisGroup& group, std::vector<at::Tensor> U, const std::vector<int64_t>& ids,
                                 const Stage& stage, const Apply& apply) {
  const int W = group.size(), r = group.rank();
  const size_t N = U.size();
  const int64_t dim = stage.dim;  // negative: indexes the same dim of stacked tensors
  const bool chunked = stage.local == 0;
  const int64_t padded_local = chunked ? (stage.global + W - 1) / W : stage.local;
  const int64_t original_local = U[0].size(dim);
  if (padded_local < original_local)
    throw ValueError("FSDP shard of size " + std::to_string(original_local) + " along dim " + std::to_string(dim) +
                     " exceeds ceil(" + std::to_string(stage.global) + " / " + std::to_string(W) +
                     "): not FSDP2 contiguous chunking");
  const size_t per_rank = (N + W - 1) / W;
  while (U.size() < per_rank * W) U.push_back(at::zeros_like(U[0]));
  for (auto& u : U) u = comm::pad_to(u, dim, padded_local);

  at::Tensor send = at::stack(U, 0);         // [W * per_rank, ..local..]: chunk j -> rank j
  at::Tensor recv = group.all_to_all(send);  // chunk i: rank i's shards of my matrices
  std::vector<at::Tensor> from = recv.unflatten(0, {W, static_cast<int64_t>(per_rank)}).unbind(0);
  at::Tensor whole = at::cat(from, dim);  // [per_rank, ..W * local..]
  const int64_t assembled = whole.size(dim);
  const bool trim = chunked && stage.global < assembled;
  if (trim) whole = whole.narrow(dim, 0, stage.global);
  at::Tensor ortho = apply(whole, share(ids, r * per_rank, per_rank));
  if (trim) ortho = comm::pad_to(ortho, dim, assembled);
  std::vector<at::Tensor> parts = at::split(ortho, padded_local, dim);  // W chunks, chunk j -> rank j
  at::Tensor back = group.all_to_all(at::cat(parts, 0));                // [W * per_rank, ..local..], owner-major
  return back.narrow(dim, 0, original_local).narrow(0, 0, static_cast<int64_t>(N));
}

// The request's orthogonalizer on whole matrices; with `request.order`, on exactly the listed
// slices of each matrix, in that order, returned at their places (zeros elsewhere).
at::Tensor apply_request(const OrthoRequest& request, const at::Tensor& whole, const std::vector<int64_t>& ids) {
  if (request.order.empty()) return request.apply(whole);
  const int64_t dim = request.order_dim;
  const int64_t k = request.order[0].size(0);
  std::vector<at::Tensor> picked;
  for (size_t j = 0; j < ids.size(); ++j)
    picked.push_back(ids[j] < 0 ? whole[static_cast<int64_t>(j)].narrow(dim, 0, k)
                                : whole[static_cast<int64_t>(j)].index_select(dim, request.order[ids[j]]));
  at::Tensor ortho = request.apply(at::stack(picked, 0));
  at::Tensor out = at::zeros_like(whole);
  for (size_t j = 0; j < ids.size(); ++j)
    if (ids[j] >= 0) out[static_cast<int64_t>(j)].index_copy_(dim, request.order[ids[j]], ortho[static_cast<int64_t>(j)]);
  return out;
}

}  // namespace

at::Tensor assemble_and_orthogonalize(Distribution& dist, std::vector<at::Tensor> U, const Layout& layout,
                                      const OrthoRequest& request) {
  AxisGroup& outer = *dist.axis(Axis::OUTER);
  std::vector<int64_t> ids(U.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  for (const at::Tensor& o : request.order)
    if (o.dim() != 1 || o.size(0) != request.order[0].size(0))
      throw ValueError("assembly: every matrix of a megabatch must select the same number of slices");
  if (!request.order.empty() && request.order.size() != U.size())
    throw ValueError("assembly: " + std::to_string(request.order.size()) + " selection orders for " +
                     std::to_string(U.size()) + " matrices");
  const Apply last = [&request](const at::Tensor& whole, const std::vector<int64_t>& which) {
    return apply_request(request, whole, which);
  };
  const Stage outer_stage{request.comm_dim, request.global_size, request.local_size};
  if (layout.two_d()) {
    // Assemble whole matrices in two stages: over the inner (TP) group along its dim, then
    // over the outer (FSDP) group along the other; orthogonalize; undo both.
    const int64_t nd = static_cast<int64_t>(layout.global_shape.size());
    const Stage inner_stage{layout.inner_dim - nd, layout.global_shape[layout.inner_dim], request.inner_local_size};
    const Apply then_outer = [&outer, &outer_stage, &last](const at::Tensor& whole_inner,
                                                           const std::vector<int64_t>& which) {
      return orthogonalize_sharded(outer, whole_inner.unbind(0), which, outer_stage, last);
    };
    return orthogonalize_sharded(*dist.axis(Axis::INNER), std::move(U), ids, inner_stage, then_outer);
  }
  if (layout.sharded()) return orthogonalize_sharded(outer, std::move(U), ids, outer_stage, last);
  return orthogonalize_replicated(outer, std::move(U), ids, last);
}

void sum_over_shards_(Distribution& dist, at::Tensor& x) {
  dist.all_reduce_(x, Axis::OUTER);
  dist.all_reduce_(x, Axis::INNER);
}

}  // namespace dion
