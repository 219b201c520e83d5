// dion/train/parallel.h — the parallel layout of a training run: the (dp, fs, tp) device mesh,
// where each GPT parameter lives, how the model computes with shards, and the data-parallel
// gradient all-reduce. The reference's train.py init_distributed + models/gpt_model.py
// parallelize_gpt_model, over dion_comm groups.
//
//   Parallel par(world, {dp, fs, tp});     // collective: builds the mesh; dp*fs*tp == world size
//   par.shard_model(model);                // parameters -> this rank's shards; model computes through par
//   par.init_model(model);                 // or: draw the weights one at a time, keeping only the shards
//   auto dist = par.distribution(sync);    // the optimizer's Distribution (null for one process)
//   GradSync ddp(par.dp_group(), params, bucket_bytes);   // DDP / HSDP gradient sum over dp
//
// Mesh: axes (dp, fs, tp), row-major with tp fastest (torch's init_device_mesh):
//   rank = (d * fs + f) * tp + t. Data: the flattened (dp, fs) index d * fs + f reads its own
//   slice of the global batch; the tp ranks of one (d, f) read the same data.
// Parameters (FSDP2 contiguous chunks, dion::comm::shard_range; tp splits are even):
//   tp > 1:  c_q, c_k, c_v, c_fc column-parallel: rows (dim 0) split over tp; c_proj row-parallel:
//            columns (dim 1) split over tp; wte and lm_head: rows split over tp at rest, gathered
//            over tp for compute (every tp rank computes the same full embedding / logits, as the
//            reference's Replicate() output layouts; backward keeps this rank's rows of the
//            identical full gradient).
//   fs > 1:  every parameter also sharded over fs along the dim tp does not split (dim 0 without
//            tp; with tp: dim 1 of c_q, c_k, c_v, c_fc, wte, lm_head, dim 0 of c_proj), as the
//            reference's fully_shard shard_placement_fn. Gathered for compute by an autograd
//            function (forward all_gather; backward reduce-scatter = all_to_all + sum over fs).
//            reshard_after_forward (the blocks' weights; as the reference, never wte / lm_head):
//            the linear that uses a gathered weight is one autograd function that saves only its
//            input and the shard and gathers the weight again in backward; otherwise the
//            gathered weight is kept from forward to backward.
//            Prefetch: the first forward records the order in which weights are gathered; from
//            then on, when a block's first weight is needed, the fs all_gathers of the next
//            block's weights are issued (async) before this block computes, and waited when used.
//            Backward's re-gathers (reshard_after_forward) are prefetched the same way.
//            The order is the same on every rank (same model code), so the collectives match.
//            set_gather_dtype(bf16) (key fsdp_param_dtype, the reference's MixedPrecisionPolicy
//            param_dtype): each shard is rounded to bf16 before its gather (half the bytes) and
//            the gathered weight is computed with in the parameter's dtype (bf16 values, so what
//            autocast makes of it is unchanged); gradients stay fp32, reduce-scattered in fp32
//            (reduce_dtype), into the fp32 shards the optimizer steps.
//            Gradient sync (set_requires_gradient_sync, as FSDP2's): on (the default), every
//            backward reduce-scatters each gathered weight's gradient; off (fast_fsdp's
//            micro-batches before the last), the gathered weights' full-size gradients are summed
//            locally and the gathered weights are kept for the next micro-batch's forward; the
//            next synced backward reduce-scatters the sum once and drops the kept weights. Costs
//            memory: the whole gathered model and its whole gradient across the micro-batches.
//   dp > 1:  replicated over dp; gradients summed over dp by GradSync (buckets of ~25 MB,
//            all_reduce launched from post-accumulate-grad hooks as their gradients become ready,
//            in bucket order on every rank, waited before the optimizer step) — unless legacy
//            Dion syncs them itself (replicate_mesh_grad_sync).
// Gradient scale: the trainer divides every micro-batch loss by the GLOBAL number of
// micro-batches (accumulation steps x data-parallel ranks), so every reduction is a plain sum and
// the result is the 1-rank gradient up to the order of the fp32 additions.
//
// Collectives run on the thread that calls forward / backward (the CPU autograd engine runs
// backward on the caller's thread), in graph order, identical on every rank.
// What it is not: the training loop, checkpoints (checkpoint.h), a launcher.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dion/comm/group.h"
#include "dion/comm/mesh.h"
#include "dion/comm/work.h"
#include "dion/optim/distribution.h"
#include "dion/train/mesh_shape.h"
#include "dion/train/gpt.h"

namespace dion::train {

// Where one parameter lives: global shape, the dim split over fs and over tp (-1: none), and
// whether the tp shards are gathered for compute (wte, lm_head) or computed with as they are.
struct ParamPlacement {
  std::string name;
  std::vector<int64_t> global_shape;
  int64_t fs_dim = -1, tp_dim = -1;
  bool tp_gather = false;
  int64_t ep_dim = -1;  // an MoE expert stack split over ep (dim 0), not over fs or tp
  int64_t efs = 1;      // ... and each ep rank's part split again along ep_dim over efs ranks (EP x FSDP)
};

// The placement of every GPT parameter (by name) at a layout; pure function of the names.
ParamPlacement placement_of(const std::string& name, const std::vector<int64_t>& global_shape, const MeshShape& mesh);

// This rank's part of a whole tensor at a placement (tp chunk, then fs chunk), and the inverse
// bookkeeping: the [start, length) box of this part in the global tensor, per dim.
at::Tensor local_part(const at::Tensor& full, const ParamPlacement& p, int fs_size, int fs_rank, int tp_size,
                      int tp_rank, int ep_size = 1, int ep_rank = 0);
struct Box {
  std::vector<int64_t> start, length;
};
Box local_box(const ParamPlacement& p, int fs_size, int fs_rank, int tp_size, int tp_rank, int ep_size = 1,
              int ep_rank = 0);

class Parallel : public ModelParallel {
 public:
  // Collective over `world`. Throws ConfigError (on every rank) when dp*fs*tp != world size.
  Parallel(comm::Group world, MeshShape shape);

  int rank() const { return world_.rank(); }
  int world_size() const { return world_.size(); }
  bool is_main() const { return world_.rank() == 0; }
  const MeshShape& shape() const { return shape_; }
  int data_rank() const;  // index of this rank's (dp, fs) position: d * fs + f
  int data_size() const { return int(shape_.dp * shape_.fs); }
  int fs_rank() const { return fs_->rank(); }
  int tp_rank() const { return tp_->rank(); }
  int ep_rank_of_data_rank(int64_t d) const { return int(d % shape_.ep); }

  comm::Group& world() { return world_; }
  const std::shared_ptr<comm::Group>& dp_group() const { return dp_; }
  // Expert parallelism (ep > 1; null otherwise): this rank's ep group, and the group of the ranks
  // that hold the same experts (their gradients are summed over it).
  const std::shared_ptr<comm::Group>& ep_group() const { return ep_; }
  const std::shared_ptr<comm::Group>& edp_group() const { return edp_; }
  // EP x FSDP (MeshShape::efs() > 1; null otherwise): the efs ranks that split this rank's
  // experts, and the ep x efs ranks that split a whole stack, member e * efs + b holding its
  // (e * efs + b)-th chunk of dim 0 (the optimizer's group for the stacks).
  const std::shared_ptr<comm::Group>& efs_group() const { return efs_; }
  const std::shared_ptr<comm::Group>& expert_shard_group() const { return eshard_; }
  // The parameters split over ep (MoE expert stacks), and every other one.
  std::vector<at::Tensor> expert_params(GPT& model) const;
  std::vector<at::Tensor> dense_params(GPT& model) const;
  const std::shared_ptr<comm::Group>& fs_group() const { return fs_; }
  const std::shared_ptr<comm::Group>& tp_group() const { return tp_; }
  const std::shared_ptr<comm::Group>& data_group() const { return data_; }  // dp x fs flattened

  // Replace every parameter of `model` (whole, identical on every rank) by this rank's part
  // (Tensor::set_data: names and identities stay) and make the model compute through this.
  void shard_model(GPT& model);
  // The same end state from a model built with GPTConfig::placeholder_weights, under the seed:
  // init_weights draws each weight whole and keeps this rank's part before drawing the next
  // (the weights of one process, never the whole model at once).
  void init_model(GPT& model);
  // Re-gather the blocks' FSDP weights in backward instead of keeping them (the reference's
  // reshard_after_forward, = not --fast_fsdp).
  void set_reshard_after_forward(bool on) { reshard_after_forward_ = on; }
  bool reshard_after_forward() const { return reshard_after_forward_; }
  // The dtype of the FSDP weight gathers (the parameter's own by default; bf16: see the top).
  void set_gather_dtype(at::ScalarType t) { gather_dtype_ = t; }
  at::ScalarType gather_dtype() const { return gather_dtype_; }
  // FSDP gathers of the forward passes so far, and how many of them were prefetched; the same
  // for backward's re-gathers (reshard_after_forward).
  int64_t gathers() const { return fwd_.gathers; }
  int64_t prefetched() const { return fwd_.prefetched; }
  int64_t regathers() const { return bwd_.gathers; }
  int64_t regathers_prefetched() const { return bwd_.prefetched; }
  // FSDP gradient reduce-scatters so far (one per gathered weight per synced backward).
  int64_t reduce_scatters() const { return reduce_scatters_; }
  // Set before each micro-batch's forward: off keeps the forward's fs-gathered weights for the
  // next micro-batch and sums their gradients locally in backward instead of reduce-scattering
  // them; the first micro-batch with it on reduce-scatters the sums (fast_fsdp: off for every
  // micro-batch of a step but the last). Turning it off again with sums not yet reduce-scattered
  // is a logic_error.
  void set_requires_gradient_sync(bool on);
  bool requires_gradient_sync() const { return sync_; }
  // backward of an fs gather of the parameter `key` (its TensorImpl): `grad` is the gathered
  // weight's gradient [.., global along fs_dim, ..] -> the parameter's shard's gradient (the
  // reduce-scatter over fs of the micro-batches' sum), or undefined while sync is off.
  at::Tensor fs_reduce_gradient(const void* key, const at::Tensor& grad);
  // backward's re-gather of `param` (fs), prefetched when it can be (GatheredLinearFn).
  at::Tensor regathered(const at::Tensor& param);
  const ParamPlacement& placement(const at::Tensor& param) const;
  const std::vector<ParamPlacement>& placements() const { return ordered_; }  // model order

  // The optimizer's Distribution for this layout (null for one process), every parameter
  // registered. `optimizer_syncs_gradients`: legacy Dion's replicate_mesh_grad_sync.
  std::shared_ptr<Distribution> distribution(GPT& model, bool optimizer_syncs_gradients) const;

  // Bytes this process's collectives sent so far (the trainer's and the optimizer's: every
  // sub-group counts into the world's CommStats).
  int64_t bytes_sent() const;

  // ModelParallel
  at::Tensor weight(const at::Tensor& param) override;
  at::Tensor linear(const at::Tensor& x, const at::Tensor& param) override;
  at::Tensor tp_enter(const at::Tensor& x) override;
  at::Tensor tp_exit(const at::Tensor& x) override;
  int64_t tp_size() const override { return shape_.tp; }
  int64_t ep_size() const override { return shape_.ep; }
  int64_t ep_rank() const override { return ep_ ? ep_->rank() : 0; }
  at::Tensor ep_exchange(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                         const std::function<void()>& meanwhile = {}) override;
  at::Tensor ep_exchange_counts(const at::Tensor& counts) override;
  double take_exchange_backward_seconds() override;
  void count_exchange_backward(double seconds) { exchange_backward_s_ += seconds; }  // ep.cpp's backward

 private:
  comm::Group world_;
  MeshShape shape_;
  std::unique_ptr<comm::DeviceMesh> mesh_;
  std::shared_ptr<comm::Group> dp_, fs_, tp_, data_;
  // (edp, ep, tp) when ep > 1; (dp, efs, ep, tp) under EP x FSDP
  std::unique_ptr<comm::DeviceMesh> ep_mesh_;
  std::shared_ptr<comm::Group> ep_, edp_, efs_, eshard_;
  std::unordered_map<const void*, ParamPlacement> placements_;
  std::vector<ParamPlacement> ordered_;

  void place(GPT& model);  // placements_, ordered_ from the global shapes
  // Prefetch along a recorded order of fs gathers (one for forward, one for backward's
  // re-gathers): the order the first pass gathered in (parameter identities, the unit of each),
  // where the current pass is in it, and the gathers in flight.
  struct Prefetch {
    std::vector<const void*> order;
    std::vector<std::string> unit;
    std::unordered_map<const void*, at::Tensor> param;
    bool recorded = false;
    size_t pos = 0;
    std::unordered_map<const void*, comm::Work> inflight;
    int64_t gathers = 0, prefetched = 0;
  };
  // This rank's fs-gathered `param`: the prefetched gather when there is one.
  at::Tensor fs_gathered(Prefetch& pf, const at::Tensor& param, const ParamPlacement& pl);
  comm::Work gather_async(const at::Tensor& param, const ParamPlacement& pl);
  // An FSDP-gathered parameter's group (fs, or efs for an expert stack under EP x FSDP), the dim
  // it is split along there and that dim's gathered length.
  bool gathered(const ParamPlacement& pl) const;
  comm::Group& gather_group(const ParamPlacement& pl) const { return pl.efs > 1 ? *efs_ : *fs_; }
  int64_t gather_dim(const ParamPlacement& pl) const { return pl.efs > 1 ? pl.ep_dim : pl.fs_dim; }
  int64_t gathered_length(const ParamPlacement& pl) const;
  bool reshard_after_forward_ = false;
  at::ScalarType gather_dtype_ = at::kFloat;
  Prefetch fwd_, bwd_;
  // Gradient sync off: the fs-gathered weights kept for the next micro-batch and the sums of
  // their gradients, by parameter.
  bool sync_ = true;
  std::unordered_map<const void*, at::Tensor> kept_, grad_sum_;
  int64_t reduce_scatters_ = 0;
  double exchange_backward_s_ = 0;
};

// Data-parallel gradient sum over `group` (DDP, HSDP's dp axis): bucketed all_reduce launched
// from the parameters' post-accumulate-grad hooks while backward runs.
//   sync.arm();       before the LAST micro-batch's backward (earlier ones only accumulate)
//   loss.backward();  buckets are launched as they fill, in bucket order
//   sync.finish();    launches what is left, waits every bucket, writes the sums into .grad
class GradSync {
 public:
  GradSync(std::shared_ptr<comm::Group> group, std::vector<at::Tensor> params, int64_t bucket_bytes);
  ~GradSync();
  void arm();
  void finish();
  int64_t buckets() const { return int64_t(buckets_.size()); }
  // Buckets of the last finish() whose all_reduce was launched from a hook during backward
  // (the others were launched by finish()).
  int64_t launched_during_backward() const { return launched_in_backward_; }

  void ready(size_t param_index);  // called by the hooks

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    size_t pending = 0;
    at::Tensor flat;
    comm::Work work;
    bool launched = false;
  };
  void launch_ready_prefix();
  void launch(Bucket& b);

  std::shared_ptr<comm::Group> group_;
  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  int64_t launched_in_backward_ = 0;
  bool armed_ = false;
};

}  // namespace dion::train
