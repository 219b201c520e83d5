// The megabatch assembly over a Distribution's per-axis collectives (see assembly.h).
#include "assembly.h"

#include <ATen/ATen.h>

#include <string>

#include "dion/comm/chunks.h"
#include "dion/errors.h"

namespace dion {

namespace {

// Each rank orthogonalizes its ceil(N / W) share; one all_gather returns every result.
at::Tensor orthogonalize_replicated(AxisGroup& group, std::vector<at::Tensor> U, const OrthoRequest& request) {
  const int W = group.size(), r = group.rank();
  const size_t N = U.size();
  const size_t per_rank = (N + W - 1) / W;
  while (U.size() < per_rank * W) U.push_back(at::zeros_like(U[0]));
  std::vector<at::Tensor> mine(U.begin() + r * per_rank, U.begin() + (r + 1) * per_rank);
  at::Tensor out = request.apply(at::stack(mine, 0)).contiguous();  // [per_rank, ...]
  at::Tensor all = group.all_gather(out);                           // [W, per_rank, ...]
  return all.flatten(0, 1).narrow(0, 0, static_cast<int64_t>(N));
}

// One all_to_all assembles whole matrices on their owners; orthogonalize; one all_to_all back.
at::Tensor orthogonalize_sharded(AxisGroup& group, std::vector<at::Tensor> U, const OrthoRequest& request) {
  const int W = group.size();
  const size_t N = U.size();
  const int64_t dim = request.comm_dim;  // negative: indexes the same dim of stacked tensors
  const int64_t padded_local = request.local_size > 0 ? request.local_size : (request.global_size + W - 1) / W;
  const int64_t original_local = U[0].size(dim);
  if (padded_local < original_local)
    throw ValueError("FSDP shard of size " + std::to_string(original_local) + " along dim " + std::to_string(dim) +
                     " exceeds ceil(" + std::to_string(request.global_size) + " / " + std::to_string(W) +
                     "): not FSDP2 contiguous chunking");
  const size_t per_rank = (N + W - 1) / W;
  while (U.size() < per_rank * W) U.push_back(at::zeros_like(U[0]));
  for (auto& u : U) u = comm::pad_to(u, dim, padded_local);

  at::Tensor send = at::stack(U, 0);         // [W * per_rank, ..local..]: chunk j -> rank j
  at::Tensor recv = group.all_to_all(send);  // chunk i: rank i's shards of my matrices
  std::vector<at::Tensor> from = recv.unflatten(0, {W, static_cast<int64_t>(per_rank)}).unbind(0);
  at::Tensor whole = at::cat(from, dim);  // [per_rank, ..W * local..]
  at::Tensor ortho = request.apply(whole);
  std::vector<at::Tensor> parts = at::split(ortho, padded_local, dim);  // W chunks, chunk j -> rank j
  at::Tensor back = group.all_to_all(at::cat(parts, 0));                // [W * per_rank, ..local..], owner-major
  return back.narrow(dim, 0, original_local).narrow(0, 0, static_cast<int64_t>(N));
}

}  // namespace

at::Tensor assemble_and_orthogonalize(Distribution& dist, std::vector<at::Tensor> U, const Layout& layout,
                                      const OrthoRequest& request) {
  AxisGroup& outer = *dist.axis(Axis::OUTER);
  if (layout.two_d()) {
    // Assemble whole matrices in two stages: over the inner (TP) group along its dim, then
    // over the outer (FSDP) group along the other; orthogonalize; undo both.
    const int64_t nd = static_cast<int64_t>(layout.global_shape.size());
    OrthoRequest inner;
    inner.comm_dim = layout.inner_dim - nd;
    inner.global_size = layout.global_shape[layout.inner_dim];
    inner.local_size = request.inner_local_size;
    inner.apply = [&outer, &request](const at::Tensor& whole_inner) {
      return orthogonalize_sharded(outer, whole_inner.unbind(0), request);
    };
    return orthogonalize_sharded(*dist.axis(Axis::INNER), std::move(U), inner);
  }
  if (layout.sharded()) return orthogonalize_sharded(outer, std::move(U), request);
  return orthogonalize_replicated(outer, std::move(U), request);
}

void sum_over_shards_(Distribution& dist, at::Tensor& x) {
  dist.all_reduce_(x, Axis::OUTER);
  dist.all_reduce_(x, Axis::INNER);
}

}  // namespace dion
