// Where this rank's optimizer state tensors sit in the whole tensors (see state_layout.h).
#include "state_layout.h"

#include <algorithm>

#include "dion/math/dion.h"

namespace dion {

namespace {
// FSDP2 chunk of `size` held by `rank` of `world`: [start, start + length).
std::pair<int64_t, int64_t> chunk(int64_t size, int world, int rank) {
  const int64_t c = (size + world - 1) / world;
  const int64_t start = std::min(size, c * rank);
  return {start, std::min(size, start + c) - start};
}

// The group splitting L.shard_dim: the layout's own (shard_over: an expert stack's EP group), else
// the outer axis.
int sharding_size(const Layout& L, const AxisPlace& at) { return L.group ? L.group->size() : at.outer_size; }
int sharding_rank(const Layout& L, const AxisPlace& at) { return L.group ? L.group->rank() : at.outer_rank; }
}  // namespace

AxisPlace axis_place(const Distribution* dist) {
  if (!dist) return {};
  return {dist->axis_size(Axis::OUTER), dist->axis_rank(Axis::OUTER), dist->axis_size(Axis::INNER),
          dist->axis_rank(Axis::INNER)};
}

QRows q_rows_of(const Layout& L, const AxisPlace& at) {
  const int64_t m = L.global_shape[0], n = L.global_shape[1];
  const bool t =
      L.sharded() ? math::dion_is_transposed_sharded(m, n, L.shard_dim, L.inner_dim) : math::dion_is_transposed(m, n);
  QRows q;
  q.rows = t ? m : n;
  q.length = q.rows;
  if (L.sharded()) std::tie(q.start, q.length) = chunk(q.rows, sharding_size(L, at), sharding_rank(L, at));
  return q;
}

Box state_box(StateLayout kind, const Layout& L, const AxisPlace& at, int64_t q_rank) {
  Box b;
  if (kind == StateLayout::SCALAR) return b;
  if (kind == StateLayout::OUTER_ROWS) {
    const QRows q = q_rows_of(L, at);
    return {{q.rows, q_rank}, {q.start, 0}, {q.length, q_rank}};
  }
  b.global = L.global_shape;
  const size_t nd = b.global.size();
  b.offset.assign(nd, 0);
  b.size = b.global;
  for (size_t d = 0; d < nd; ++d) {
    if (static_cast<int64_t>(d) == L.shard_dim)
      std::tie(b.offset[d], b.size[d]) = chunk(b.global[d], sharding_size(L, at), sharding_rank(L, at));
    if (static_cast<int64_t>(d) == L.inner_dim)
      std::tie(b.offset[d], b.size[d]) = chunk(b.global[d], at.inner_size, at.inner_rank);
  }
  if (kind == StateLayout::NEURON && nd > 0) {  // [.., m, 1]: the last dim is whole on every rank
    b.global.back() = 1;
    b.offset.back() = 0;
    b.size.back() = 1;
  }
  return b;
}

}  // namespace dion
