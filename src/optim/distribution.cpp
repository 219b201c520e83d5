// The optimizer's Distribution (see include/dion/optim/distribution.h): the parameters' layouts
// and their one-time check across ranks, the per-axis collectives, the replicas' average.
#include "dion/optim/distribution.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "dion/comm/chunks.h"
#include "dion/errors.h"

namespace dion {

namespace {
std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}
}  // namespace

Distribution::Distribution(std::shared_ptr<AxisGroup> outer, std::shared_ptr<AxisGroup> inner, bool sync_gradients)
    : outer_(std::move(outer)), inner_(std::move(inner)), sync_gradients_(sync_gradients) {
  if (!outer_) throw ValueError("Distribution: the outer group is null");
}

Distribution& Distribution::replicate(std::shared_ptr<AxisGroup> replicate, bool sync_gradients) {
  if (!replicate) throw ValueError("Distributed::replicate: the group is null (this rank is not a member?)");
  replicate_ = std::move(replicate);
  sync_gradients_ = sync_gradients;
  return *this;
}

Distribution& Distribution::overlap(int k) {
  if (k < 1) throw ValueError("Distributed::overlap: need at least 1 task in flight, got " + std::to_string(k));
  in_flight_ = k;
  return *this;
}

void Distribution::shard_over(std::shared_ptr<AxisGroup> group, const at::Tensor& local,
                              std::vector<int64_t> global_shape, int64_t dim) {
  if (!group) throw ValueError("Distribution::shard_over: the group is null (this rank is not a member?)");
  std::ostringstream err;
  const int64_t nd = static_cast<int64_t>(global_shape.size());
  if (dim < 0) dim += nd;
  if (dim < 0 || dim >= nd) {
    err << "shard_over dim " << dim << " is out of range for global shape " << shape_str(global_shape);
  } else if (local.dim() != nd) {
    err << "local shard of shape " << shape_str(local.sizes()) << " does not have the rank of global shape "
        << shape_str(global_shape);
  } else {
    const comm::Chunk c = comm::shard_range(global_shape[dim], group->size(), group->rank());
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t want = d == dim ? c.length : global_shape[d];
      if (local.size(d) != want) {
        err << "local shard of shape " << shape_str(local.sizes()) << " on rank " << group->rank() << " of "
            << group->size() << " of group '" << group->name() << "' (shard_over) does not match global shape "
            << shape_str(global_shape) << " split on dim " << dim << " (expected " << want << " along dim " << d
            << "; FSDP2 chunks of ceil(size / world))";
        break;
      }
    }
  }
  if (!err.str().empty() && local_error_.empty()) local_error_ = err.str();
  AxisGroup* g = group.get();
  if (g != outer_.get() && g != inner_.get() &&
      std::none_of(own_groups_.begin(), own_groups_.end(), [g](const auto& o) { return o.get() == g; }))
    own_groups_.push_back(std::move(group));
  Layout L{std::move(global_shape), dim, false, -1};
  L.group = g;
  layouts_[local.unsafeGetTensorImpl()] = std::move(L);
  verified_ = false;
}

void Distribution::shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim, int64_t inner_dim) {
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
    err << "2-D sharding of global shape " << shape_str(global_shape) << " must shard the two matrix dims (got " << dim
        << " and " << inner_dim << ")";
  } else if (local.dim() != nd) {
    err << "local shard of shape " << shape_str(local.sizes()) << " does not have the rank of global shape "
        << shape_str(global_shape);
  } else {
    const comm::Chunk c = comm::shard_range(global_shape[dim], outer_->size(), outer_->rank());
    const comm::Chunk ci =
        inner_dim >= 0 ? comm::shard_range(global_shape[inner_dim], inner_->size(), inner_->rank()) : comm::Chunk{};
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t want = d == dim ? c.length : d == inner_dim ? ci.length : global_shape[d];
      if (local.size(d) != want) {
        err << "local shard of shape " << shape_str(local.sizes()) << " on rank " << outer_->rank() << " of "
            << outer_->size() << " does not match global shape " << shape_str(global_shape) << " sharded on dim " << dim
            << " (expected " << want << " along dim " << d << "; FSDP2 chunks of ceil(size / world))";
        break;
      }
    }
  }
  if (!err.str().empty() && local_error_.empty()) local_error_ = err.str();
  layouts_[local.unsafeGetTensorImpl()] = Layout{std::move(global_shape), dim, false, inner_dim};
  verified_ = false;
}

Layout Distribution::layout(const at::Tensor& param) const {
  auto it = layouts_.find(param.unsafeGetTensorImpl());
  if (it != layouts_.end()) return it->second;
  return Layout{param.sizes().vec(), -1, outer_->size() > 1};
}

void Distribution::prepare() { verify(); }

void Distribution::verify() const {
  if (verified_) return;
  at::Tensor bad =
      at::full({1}, local_error_.empty() ? 0 : 1, at::TensorOptions(at::kInt).device(outer_->control_device()));
  outer_->all_reduce_(bad);
  if (inner_) {
    bad = bad.to(inner_->control_device());
    inner_->all_reduce_(bad);
  }
  for (const auto& g : own_groups_) {  // shard_over's groups, in the same order on every rank
    bad = bad.to(g->control_device());
    g->all_reduce_(bad);
  }
  verified_ = true;
  const int n = bad.item<int>();
  if (n == 0) return;
  if (!local_error_.empty()) throw ValueError(local_error_);
  throw ValueError("invalid shard specification on " + std::to_string(n) + " other rank(s) of group '" +
                   outer_->name() + "'; see their error messages");
}

AxisGroup* Distribution::axis(Axis axis) const {
  switch (axis) {
    case Axis::OUTER:
      return outer_.get();
    case Axis::INNER:
      return inner_.get();
    case Axis::REPLICA:
      return replicate_.get();
  }
  return nullptr;
}

int Distribution::axis_size(Axis a) const {
  const AxisGroup* g = axis(a);
  return g ? g->size() : 1;
}

int Distribution::axis_rank(Axis a) const {
  const AxisGroup* g = axis(a);
  return g ? g->rank() : 0;
}

void Distribution::all_reduce_(at::Tensor& x, Axis a) {
  if (AxisGroup* g = axis(a)) g->all_reduce_(x);
}

at::Tensor Distribution::all_gather(const at::Tensor& x, Axis a) {
  if (AxisGroup* g = axis(a)) return g->all_gather(x);
  return x.unsqueeze(0);
}

at::Tensor Distribution::all_to_all(const at::Tensor& x, Axis a) {
  if (AxisGroup* g = axis(a)) return g->all_to_all(x);
  return x;
}

void Distribution::average_over_replicas_(at::Tensor& x) {
  AxisGroup& g = replicate_ ? *replicate_ : *outer_;
  if (g.size() == 1) return;
  g.all_reduce_(x);
  x.div_(g.size());
}

}  // namespace dion
