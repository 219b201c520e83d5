// The optimizer's Distribution over dion_comm groups (see include/dion/dist/distributed.h):
// DDP / FSDP / FSDP x TP / HSDP megabatch assembly and the per-axis collectives the algorithms
// use. Everything runs on the caller's thread; see dion/comm/tasks.h for the overlap.
#include "dion/dist/distributed.h"

#include <ATen/ATen.h>

#include <sstream>

#include "dion/errors.h"

namespace dion::dist {

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

namespace {
// Zero-pad `t` at the end of `dim` to `size`.
at::Tensor pad_to(const at::Tensor& t, int64_t dim, int64_t size) {
  const int64_t have = t.size(dim);
  if (have == size) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim < 0 ? dim + t.dim() : dim] = size - have;
  return at::cat({t, at::zeros(shape, t.options())}, dim);
}

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}
}  // namespace

at::Tensor gather_tensor(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size) {
  return join_gathered(gather_tensor_async(group, local, dim, global_size).wait(), dim, global_size);
}

comm::Work gather_tensor_async(Group& group, const at::Tensor& local, int64_t dim, int64_t global_size) {
  const int64_t chunk = (global_size + group.size() - 1) / group.size();
  // A copy: the collective may read its input after this returns, and `local` may change.
  at::Tensor in = pad_to(local, dim, chunk);
  if (in.is_same(local)) in = local.clone();
  return group.all_gather_async(in);  // -> [W, ..chunk..]
}

at::Tensor join_gathered(const at::Tensor& all, int64_t dim, int64_t global_size) {
  return at::cat(all.unbind(0), dim).narrow(dim, 0, global_size).contiguous();
}

Distributed::Distributed(std::shared_ptr<Group> outer, std::shared_ptr<Group> inner)
    : Distributed(std::move(outer)) {
  if (!inner) throw ValueError("Distributed: the inner (TP) group is null (this rank is not a member?)");
  inner_ = std::move(inner);
}

Distributed::Distributed(std::shared_ptr<Group> group, bool sync_gradients)
    : group_(std::move(group)), sync_gradients_(sync_gradients) {
  if (!group_) throw ValueError("Distributed: the group is null (this rank is not a member?)");
}

void Distributed::shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim,
                        int64_t inner_dim) {
  std::ostringstream err;
  const int64_t nd = static_cast<int64_t>(global_shape.size());
  if (dim < 0) dim += nd;
  if (inner_dim < -1) inner_dim += nd;
  if (dim < 0 || dim >= nd) {
    err << "shard dim " << dim << " is out of range for global shape " << shape_str(global_shape);
  } else if (inner_dim >= 0 && !inner_) {
    err << "parameter of global shape " << shape_str(global_shape) << " sharded on dim " << inner_dim
        << " over an inner (TP) group, but this Distributed has none: construct it with (outer, inner)";
  } else if (inner_dim == dim) {
    err << "global shape " << shape_str(global_shape) << ": dim " << dim << " sharded twice (outer and inner)";
  } else if (inner_dim >= nd) {
    err << "inner shard dim " << inner_dim << " is out of range for global shape " << shape_str(global_shape);
  } else if (inner_dim >= 0 && (std::min(dim, inner_dim) != nd - 2 || std::max(dim, inner_dim) != nd - 1)) {
    err << "2-D sharding of global shape " << shape_str(global_shape) << " must shard the two matrix dims (got "
        << dim << " and " << inner_dim << ")";
  } else if (local.dim() != nd) {
    err << "local shard of shape " << shape_str(local.sizes()) << " does not have the rank of global shape "
        << shape_str(global_shape);
  } else {
    const Chunk c = shard_range(global_shape[dim], group_->size(), group_->rank());
    const Chunk ci = inner_dim >= 0 ? shard_range(global_shape[inner_dim], inner_->size(), inner_->rank()) : Chunk{};
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t want = d == dim ? c.length : d == inner_dim ? ci.length : global_shape[d];
      if (local.size(d) != want) {
        err << "local shard of shape " << shape_str(local.sizes()) << " on rank " << group_->rank() << " of "
            << group_->size() << " does not match global shape " << shape_str(global_shape)
            << " sharded on dim " << dim << " (expected " << want << " along dim " << d
            << "; FSDP2 chunks of ceil(size / world))";
        break;
      }
    }
  }
  if (!err.str().empty() && local_error_.empty()) local_error_ = err.str();
  layouts_[local.unsafeGetTensorImpl()] = Layout{std::move(global_shape), dim, false, inner_dim};
  verified_ = false;
}

Distributed& Distributed::overlap(int k) {
  if (k < 1) throw ValueError("Distributed::overlap: need at least 1 task in flight, got " + std::to_string(k));
  in_flight_ = k;
  return *this;
}

void Distributed::prepare() { verify(); }

Distributed& Distributed::replicate(std::shared_ptr<Group> replicate, bool sync_gradients) {
  if (!replicate) throw ValueError("Distributed::replicate: the group is null (this rank is not a member?)");
  replicate_ = std::move(replicate);
  sync_gradients_ = sync_gradients;
  return *this;
}

Group* Distributed::axis_group(Axis axis) {
  switch (axis) {
    case Axis::OUTER: return group_.get();
    case Axis::INNER: return inner_.get();
    case Axis::REPLICA: return replicate_.get();
  }
  return nullptr;
}

const Group* Distributed::axis_group(Axis axis) const {
  switch (axis) {
    case Axis::OUTER: return group_.get();
    case Axis::INNER: return inner_.get();
    case Axis::REPLICA: return replicate_.get();
  }
  return nullptr;
}

int Distributed::axis_size(Axis axis) const {
  const Group* g = axis_group(axis);
  return g ? g->size() : 1;
}

int Distributed::axis_rank(Axis axis) const {
  const Group* g = axis_group(axis);
  return g ? g->rank() : 0;
}

void Distributed::all_reduce_(at::Tensor& x, Axis axis) {
  if (Group* g = axis_group(axis)) g->all_reduce_(x);
}

at::Tensor Distributed::all_gather(const at::Tensor& x, Axis axis) {
  if (Group* g = axis_group(axis)) return g->all_gather(x);
  return x.unsqueeze(0);
}

at::Tensor Distributed::all_to_all(const at::Tensor& x, Axis axis) {
  if (Group* g = axis_group(axis)) return g->all_to_all(x);
  return x;
}

void Distributed::verify() const {
  if (verified_) return;
  at::Tensor bad = at::full({1}, local_error_.empty() ? 0 : 1, at::TensorOptions(at::kInt).device(group_->control_device()));
  group_->all_reduce_(bad);
  if (inner_) {
    bad = bad.to(inner_->control_device());
    inner_->all_reduce_(bad);
  }
  verified_ = true;
  const int n = bad.item<int>();
  if (n == 0) return;
  if (!local_error_.empty()) throw ValueError(local_error_);
  throw ValueError("invalid shard specification on " + std::to_string(n) + " other rank(s) of group '" +
                   group_->name() + "'; see their error messages");
}

Layout Distributed::layout(const at::Tensor& param) const {
  // Not collective: the shard specs are checked across ranks in prepare().
  auto it = layouts_.find(param.unsafeGetTensorImpl());
  if (it != layouts_.end()) return it->second;
  return Layout{param.sizes().vec(), -1, group_->size() > 1};
}

void Distributed::sum_over_shards_(at::Tensor& x) {
  outer().all_reduce_(x);
  if (inner_) inner().all_reduce_(x);
}

void Distributed::average_over_replicas_(at::Tensor& x) {
  Group& g = replicate_ ? *replicate_ : outer();
  if (g.size() == 1) return;
  g.all_reduce_(x);
  x.div_(g.size());
}

at::Tensor Distributed::orthogonalize(std::vector<at::Tensor> U, const Layout& layout,
                                      const OrthoRequest& request) {
  if (layout.two_d()) {
    // Assemble whole matrices in two stages: over the inner (TP) group along its dim, then
    // over the outer (FSDP) group along the other; orthogonalize; undo both.
    const int64_t nd = static_cast<int64_t>(layout.global_shape.size());
    OrthoRequest inner;
    inner.comm_dim = layout.inner_dim - nd;
    inner.global_size = layout.global_shape[layout.inner_dim];
    inner.local_size = request.inner_local_size;
    inner.apply = [this, &request](const at::Tensor& whole_inner) {
      return orthogonalize_sharded(outer(), whole_inner.unbind(0), request);
    };
    return orthogonalize_sharded(this->inner(), std::move(U), inner);
  }
  if (layout.sharded()) return orthogonalize_sharded(outer(), std::move(U), request);
  return orthogonalize_replicated(std::move(U), request);
}

// Each rank orthogonalizes its ceil(N / W) share; one all_gather returns every result.
at::Tensor Distributed::orthogonalize_replicated(std::vector<at::Tensor> U, const OrthoRequest& request) {
  const int W = group_->size(), r = group_->rank();
  const size_t N = U.size();
  const size_t per_rank = (N + W - 1) / W;
  while (U.size() < per_rank * W) U.push_back(at::zeros_like(U[0]));
  std::vector<at::Tensor> mine(U.begin() + r * per_rank, U.begin() + (r + 1) * per_rank);
  at::Tensor out = request.apply(at::stack(mine, 0)).contiguous();  // [per_rank, ...]
  at::Tensor all = outer().all_gather(out);                         // [W, per_rank, ...]
  return all.flatten(0, 1).narrow(0, 0, static_cast<int64_t>(N));
}

// One all_to_all assembles whole matrices on their owners; orthogonalize; one all_to_all back.
at::Tensor Distributed::orthogonalize_sharded(Group& group, std::vector<at::Tensor> U,
                                              const OrthoRequest& request) {
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
  for (auto& u : U) u = pad_to(u, dim, padded_local);

  at::Tensor send = at::stack(U, 0);                       // [W * per_rank, ..local..]: chunk j -> rank j
  at::Tensor recv = group.all_to_all(send);                 // chunk i: rank i's shards of my matrices
  std::vector<at::Tensor> from = recv.unflatten(0, {W, static_cast<int64_t>(per_rank)}).unbind(0);
  at::Tensor whole = at::cat(from, dim);                    // [per_rank, ..W * local..]
  at::Tensor ortho = request.apply(whole);
  std::vector<at::Tensor> parts = at::split(ortho, padded_local, dim);  // W chunks, chunk j -> rank j
  at::Tensor back = group.all_to_all(at::cat(parts, 0));    // [W * per_rank, ..local..], owner-major
  return back.narrow(dim, 0, original_local).narrow(0, 0, static_cast<int64_t>(N));
}

}  // namespace dion::dist
