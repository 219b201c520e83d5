// FSDP2 contiguous chunks and their gathers and reduce-scatters (see include/dion/comm/chunks.h).
#include "dion/comm/chunks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace dion::comm {

Chunk shard_range(int64_t size, int world, int rank) {
  const int64_t chunk = (size + world - 1) / world;
  Chunk c;
  c.start = std::min<int64_t>(size, chunk * rank);
  c.length = std::max<int64_t>(0, std::min<int64_t>(size, chunk * (rank + 1)) - c.start);
  return c;
}

at::Tensor shard_tensor(const at::Tensor& full, int64_t dim, int world, int rank) {
  const Chunk c = shard_range(full.size(dim), world, rank);
  return full.narrow(dim, c.start, c.length).clone(at::MemoryFormat::Contiguous);  // never a view
}

at::Tensor pad_to(const at::Tensor& t, int64_t dim, int64_t size) {
  const int64_t have = t.size(dim);
  if (have == size) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim < 0 ? dim + t.dim() : dim] = size - have;
  return at::cat({t, at::zeros(shape, t.options())}, dim);
}

at::Tensor gather_tensor(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size) {
  return join_gathered(gather_tensor_async(group, local, dim, global_size).wait(), dim, global_size);
}

Work gather_tensor_async(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size) {
  const int64_t chunk = (global_size + group.size() - 1) / group.size();
  // A copy: the collective may read its input after this returns, and `local` may change.
  at::Tensor in = pad_to(local, dim, chunk);
  if (in.is_same(local)) in = local.clone();
  return group.all_gather_async(in);  // -> [W, ..chunk..]
}

at::Tensor join_gathered(const at::Tensor& all, int64_t dim, int64_t global_size) {
  return at::cat(all.unbind(0), dim).narrow(dim, 0, global_size).contiguous();
}

at::Tensor reduce_scatter(Group& g, const at::Tensor& full, int64_t dim) {
  const int W = g.size();
  const int64_t global = full.size(dim);
  const int64_t chunk = (global + W - 1) / W;
  at::Tensor x = full.movedim(dim, 0);  // [global, ...]
  if (W * chunk != global) {
    std::vector<int64_t> pad = x.sizes().vec();
    pad[0] = W * chunk - global;
    x = at::cat({x, at::zeros(pad, x.options())}, 0);
  }
  x = x.contiguous();
  std::vector<int64_t> split = x.sizes().vec();
  split[0] = chunk;
  split.insert(split.begin(), W);
  at::Tensor parts = g.all_to_all(x).view(split);  // [W, chunk, ...]: part i from rank i
  const Chunk mine = shard_range(global, W, g.rank());
  return parts.sum(0).narrow(0, 0, mine.length).movedim(0, dim).contiguous();
}

}  // namespace dion::comm
