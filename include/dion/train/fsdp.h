// dion/train/fsdp.h — FSDP's runtime in a training run: the weights gathered over fs (or an
// expert stack's own group) for compute, prefetched a unit ahead, kept or re-gathered in backward, and
// the gradients reduce-scattered back; Parallel (parallel.h) owns one.
//
// An MoE expert stack under EP x FSDP is gathered the same way over its own group (mesh.h).
// Forward: the first pass records the order of the gathers; from then on a unit's (a block's)
// first weight issues the next unit's gathers (async) before it computes. reshard_after_forward
// (the blocks' weights; never wte / lm_head, as the reference): a linear saves only its input
// and the shard and gathers the weight again in backward, prefetched the same way; otherwise the
// gathered weight is kept to backward. gather_dtype bf16 (fsdp_param_dtype): shards rounded to
// bf16 before the gather, computed with in the parameter's dtype; gradients stay fp32.
// requires_gradient_sync off (fast_fsdp's micro-batches before the last): gradients of the
// gathered weights summed locally at full size, the gathered weights kept; the next synced
// backward reduce-scatters the sums once. The order is the same on every rank (same model code).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "dion/comm/work.h"
#include "dion/train/gpt.h"
#include "dion/train/mesh.h"

namespace dion::train {

class Fsdp {
 public:
  Fsdp(const Mesh& mesh, const Placements& placements) : mesh_(mesh), placements_(placements) {}

  void set_reshard_after_forward(bool on) { reshard_after_forward_ = on; }
  bool reshard_after_forward() const { return reshard_after_forward_; }
  void set_gather_dtype(at::ScalarType t) { gather_dtype_ = t; }
  // Turning it off again with sums not yet reduce-scattered is a logic_error.
  void set_requires_gradient_sync(bool on);
  bool requires_gradient_sync() const { return sync_; }

  // Forward gathers so far and how many were prefetched; backward's re-gathers the same; the
  // gradient reduce-scatters (one per gathered weight per synced backward).
  int64_t gathers() const { return fwd_.gathers; }
  int64_t prefetched() const { return fwd_.prefetched; }
  int64_t regathers() const { return bwd_.gathers; }
  int64_t regathers_prefetched() const { return bwd_.prefetched; }
  int64_t reduce_scatters() const { return reduce_scatters_; }

  bool gathered(const Placement& pl) const;  // split over fs (or an expert stack's group) here
  // The parameter gathered for compute, differentiable back to its shard.
  at::Tensor weight(const at::Tensor& param, const Placement& pl);
  // x W^T with W gathered now and again in backward (reshard_after_forward); undefined when
  // this parameter is not resharded (the caller computes with weight()).
  at::Tensor resharded_linear(const at::Tensor& x, const at::Tensor& param, const Placement& pl, Kernels kernels);

  // For the autograd functions: the gathered weight's gradient -> the shard's (reduce-scatter of
  // the micro-batches' sum; undefined while sync is off); backward's re-gather of `param`.
  at::Tensor reduce_gradient(const void* key, const at::Tensor& grad);
  at::Tensor regathered(const at::Tensor& param);

 private:
  // A recorded order of gathers (parameter identities, the unit of each), the position of the
  // current pass in it and the gathers in flight: one for forward, one for backward's re-gathers.
  struct Prefetch {
    std::vector<const void*> order;
    std::vector<std::string> unit;
    std::unordered_map<const void*, at::Tensor> param;
    bool recorded = false;
    size_t pos = 0;
    std::unordered_map<const void*, comm::Work> inflight;
    int64_t gathers = 0, prefetched = 0;
  };
  at::Tensor gathered_now(Prefetch& pf, const at::Tensor& param, const Placement& pl);
  comm::Work gather_async(const at::Tensor& param, const Placement& pl);
  // The group a parameter is gathered over, the dim it is split along there, that dim's length.
  comm::Group& group(const Placement& pl) const;
  int64_t dim(const Placement& pl) const;
  int64_t gathered_length(const Placement& pl) const;

  const Mesh& mesh_;
  const Placements& placements_;
  bool reshard_after_forward_ = false;
  at::ScalarType gather_dtype_ = at::kFloat;
  Prefetch fwd_, bwd_;
  bool sync_ = true;
  std::unordered_map<const void*, at::Tensor> kept_, grad_sum_;  // sync off: by parameter
  int64_t reduce_scatters_ = 0;
};

}  // namespace dion::train
