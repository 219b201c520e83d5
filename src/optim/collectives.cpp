// The algorithms' communication patterns (see collectives.h).
#include "dion/optim/collectives.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <limits>

#include "assembly.h"
#include "dion/math/dion.h"

namespace dion {

// ---------------------------------------------------------------------------- gradients

std::vector<at::Tensor> Collectives::synced_gradients(const std::vector<at::Tensor>& params) const {
  std::vector<at::Tensor> G;
  for (const at::Tensor& p : params) G.push_back(p.grad());
  if (!dist_ || !dist_->sync_gradients()) return G;
  for (size_t i = 0; i < G.size(); ++i) {
    // FSDP gradients arrive reduce-scattered over the shard group; HSDP averages them over the
    // replicate group.
    if (dist_->layout(params[i]).sharded() && dist_->axis_size(Axis::REPLICA) <= 1) continue;
    G[i] = G[i].clone(at::MemoryFormat::Contiguous);
    dist_->average_over_replicas_(G[i]);
  }
  return G;
}

void Collectives::average_over_replicas_(at::Tensor& x) const {
  if (dist_) dist_->average_over_replicas_(x);
}

bool Collectives::sync_gradients() const { return dist_ && dist_->sync_gradients(); }

// ---------------------------------------------------------------------------- Muon family

at::Tensor Collectives::assemble_orthogonalize(std::vector<at::Tensor> U, const Plan& plan, const Options& o,
                                               const math::OrthoFn& fn, const std::vector<int64_t>& split_sizes,
                                               const std::vector<double>& split_scales, int64_t local_size,
                                               int64_t inner_local_size, std::vector<at::Tensor> order,
                                               int64_t order_dim) const {
  const bool flatten = o.flatten();
  const double eps = o.epsilon();
  auto apply = [&fn, flatten, eps, &split_sizes, &split_scales](const at::Tensor& stacked) {
    return math::orthogonalize_megabatch(stacked, fn, flatten, eps, split_sizes, split_scales);
  };
  if (!plan.communicate || !dist_) {
    // One parameter: orthogonalize it as it is (the reference's N == 1 path); several: one stack.
    at::Tensor stacked;
    {
      RECORD_USER_SCOPE("dion::stack");
      stacked = math::stack_megabatch(U);  // a view when the pre step wrote U into one buffer
    }
    return apply(stacked);
  }
  OrthoRequest request;
  request.apply = apply;
  request.comm_dim = plan.comm_dim;
  if (plan.layout.sharded()) {
    const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
    request.global_size = plan.layout.global_shape[ndim + plan.comm_dim];
  }
  request.local_size = local_size;
  request.inner_local_size = inner_local_size;
  request.order = std::move(order);
  request.order_dim = order_dim;
  return assemble_and_orthogonalize(*dist_, std::move(U), plan.layout, request);
}

math::ShardSum Collectives::shard_sum(const Plan& plan) const {
  if (!dist_ || !(plan.splits(-2) || plan.splits(-1))) return nullptr;
  Distribution* d = dist_;
  return [d](at::Tensor& t) { sum_over_shards_(*d, t); };
}

math::ColumnShards Collectives::column_shards(const Plan& plan) const {
  if (!dist_ || !plan.splits(-1)) return {};
  // The axis sharding the last dim: the outer one (1-D, or 2-D's comm dim), else the inner one.
  const Axis axis = plan.comm_dim == -1 ? Axis::OUTER : Axis::INNER;
  Distribution* d = dist_;
  math::ColumnShards cols;
  cols.sum_over_columns = [d, axis](at::Tensor& t) { d->all_reduce_(t, axis); };
  cols.columns = plan.layout.global_shape.back();
  return cols;
}

// ---------------------------------------------------------------------------- Dion2

math::ShardSum Collectives::sum_norms_over_shards() const {
  if (!dist_) return nullptr;
  Distribution* d = dist_;
  return [d](at::Tensor& t) { sum_over_shards_(*d, t); };
}

// Each rank's slice norms (padded to ceil(global / W) with -inf) travel in one all_gather. With
// FSDP2 chunks only the end of the rank-major concatenation is padding, so every rank takes the
// top-k of exactly one process's norm vector: the same slices in the same order.
Collectives::ShardSelection Collectives::top_k_over_shards(at::Tensor norms, int64_t k, int64_t global, Axis holder,
                                                           Axis splitter) const {
  const int64_t W = dist_ ? dist_->axis_size(holder) : 1, r = dist_ ? dist_->axis_rank(holder) : 0;
  const int64_t N = norms.size(0);
  const int64_t padded = (global + W - 1) / W;
  if (dist_) dist_->all_reduce_(norms, splitter);  // 2-D sharding: the other blocks' partial L1 norms
  at::Tensor padded_norms = at::full({N, padded}, -std::numeric_limits<float>::infinity(), norms.options());
  padded_norms.narrow(1, 0, norms.size(1)).copy_(norms);
  at::Tensor all = dist_ ? dist_->all_gather(padded_norms, holder) : padded_norms.unsqueeze(0);  // [W, N, padded]
  at::Tensor global_norms = all.permute({1, 0, 2}).reshape({N, W * padded}).narrow(1, 0, global).contiguous();
  at::Tensor gidx = std::get<1>(at::topk(global_norms, k, -1, true, false));  // [N, k], one process's order
  at::Tensor owner = at::div(gidx, padded, "floor"), local = gidx.remainder(padded);
  // Each selected slice's place among its owner's: the owner keeps its slices in top-k order.
  at::Tensor is_owner = owner.unsqueeze(-1) == at::arange(W, owner.options()).view({1, 1, W});  // [N, k, W]
  at::Tensor counts = is_owner.to(at::kLong).cumsum(1);                                         // [N, k, W]
  at::Tensor slot = counts.gather(2, owner.unsqueeze(-1)).squeeze(-1) - 1;                       // [N, k]
  ShardSelection out;
  out.k_pad = k > 0 ? counts.select(1, k - 1).max().item<int64_t>() : 0;
  at::Tensor place = owner * out.k_pad + slot;  // in the assembled matrix: owner-major, k_pad slots a rank
  for (int64_t i = 0; i < N; ++i) {
    out.mine.push_back(local[i].masked_select(owner[i] == r));  // top-k order
    out.order.push_back(place[i]);
  }
  return out;
}

// ---------------------------------------------------------------------------- legacy Dion

at::Tensor Collectives::orthonormalize_P_split_over_replicas(const at::Tensor& P, float oversample) const {
  const int64_t W = dist_->world_size(), rank = dist_->rank(), N = P.size(0);
  const int64_t per_rank = (N + W - 1) / W;
  at::Tensor padded =
      N == per_rank * W ? P : at::cat({P, at::zeros({per_rank * W - N, P.size(1), P.size(2)}, P.options())});
  at::Tensor mine = math::dion_orthonormalize(padded.narrow(0, rank * per_rank, per_rank), oversample);
  return dist_->all_gather(mine.contiguous(), Axis::OUTER).flatten(0, 1).narrow(0, 0, N);
}

at::Tensor Collectives::reduce_scatter_then_orthonormalize_P(const at::Tensor& P, float oversample,
                                                             bool compressed) const {
  const int64_t N = P.size(0), r = P.size(2), W = dist_->axis_size(Axis::OUTER);
  const int64_t per = (N + W - 1) / W;
  at::Tensor padded = N == per * W ? P : at::cat({P, at::zeros({per * W - N, P.size(1), r}, P.options())});
  at::Tensor mine = dist_->all_to_all(padded, Axis::OUTER).view({W, per, P.size(1), r}).sum(0);
  if (compressed) dist_->average_over_replicas_(mine);
  mine = math::dion_orthonormalize(mine, oversample);
  return dist_->all_gather(mine.contiguous(), Axis::OUTER).flatten(0, 1).narrow(0, 0, N);
}

at::Tensor Collectives::all_reduce_then_orthonormalize_P(at::Tensor P, int64_t a, float oversample, bool compressed,
                                                         uint64_t seed) const {
  dist_->all_reduce_(P, Axis::OUTER);
  if (compressed) dist_->average_over_replicas_(P);
  const int64_t N = P.size(0), r = P.size(2);
  const int64_t T = dist_->axis_size(Axis::INNER);
  const int64_t chunk = (a + T - 1) / T, a_local = P.size(1);
  at::Tensor pad = a_local == chunk ? P : at::cat({P, at::zeros({N, chunk - a_local, r}, P.options())}, 1);
  at::Tensor all = dist_->all_gather(pad.contiguous(), Axis::INNER);  // [T, N, chunk, r]
  at::Tensor full = all.permute({1, 0, 2, 3}).reshape({N, T * chunk, r}).narrow(1, 0, a);
  // The sketch generator lives on P's device (a CPU generator into a CUDA normal_ is refused).
  at::Generator gen = math::dion_sketch_generator(full.device(), seed);
  full = math::dion_orthonormalize(full.contiguous(), oversample, gen);
  const int64_t t = dist_->axis_rank(Axis::INNER), start = std::min(a, chunk * t);
  return full.narrow(1, start, a_local).contiguous();
}

void Collectives::sum_R_over_inner_(at::Tensor& R) const { dist_->all_reduce_(R, Axis::INNER); }

math::ShardSum Collectives::sum_over_outer() const {
  Distribution* d = dist_;
  return [d](at::Tensor& t) { d->all_reduce_(t, Axis::OUTER); };
}

}  // namespace dion
