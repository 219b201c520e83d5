// dion/train/gpt.h — the reference's GPT (microsoft/dion models/gpt_model.py) as a LibTorch
// module.
//
//   token embedding wte [V, C]
//   n_layer blocks:  x = x + attn(rms_norm(x));  x = x + mlp(rms_norm(x))
//     attn: c_q, c_k, c_v [C, C] (no bias); rotary on q, k (cos/sin rounded to bf16, as the
//           reference); q, k RMS-normed per head (qk_norm); causal scaled_dot_product_attention; c_proj
//     mlp:  c_fc [4C, C], relu(x)^2, c_proj [C, 4C] (no bias)
//   final rms_norm, untied lm_head [V, C] (no bias), logits in fp32, cross entropy (mean)
// Initialization (init_weights): Linear ~ N(0, 1/sqrt(fan_in) * min(1, sqrt(fan_out/fan_in))),
// Embedding ~ N(0, 1), drawn from the default generator in the reference's module order (wte,
// then each block's c_q, c_k, c_v, c_proj, c_fc, c_proj, then lm_head), so that the same seed
// gives the same weights as the reference's `torch.manual_seed(s); model.init_weights()`.
// GPTConfig::placeholder_weights: the constructor leaves every weight a 4-byte placeholder of
// its shape (one element, expanded) and init_weights draws them one at a time, each passed
// through `keep` (a parallel layout keeps its shard), so that no process holds the whole model.
// Parameter names are the reference's state_dict keys ("transformer.h.0.attn.c_q.weight").
//
// Shapes: idx, targets [B, T] int64; x [B, T, C]; q, k, v [B, T, H, D] (D = C / H);
// logits [B, T, V].
//
// Parallel layouts: with set_parallel(), every weight is read through ModelParallel::weight()
// (FSDP gathers shards there) and the attention / MLP run Megatron-style tensor parallel over
// ModelParallel's TP group (column-parallel c_q, c_k, c_v, c_fc; row-parallel c_proj; n_head /
// tp heads per rank). dion/train/parallel.h implements it; without it every weight is whole.
//
// GPTConfig::qk_norm false: q and k enter the attention as projected and rotated, not RMS-normed
// (models without QK norm; their logits can grow, which QK-clip bounds). track_max_logits: each
// attention keeps the largest pre-softmax logit of each of its heads over the training forwards
// (q . k / sqrt(D), causal; one more QK^T product a layer, no gradient) until take_max_logits().
//
// GPTConfig::kernels: the GEMMs and the loss computed by ATen in the reference's order (exact,
// the default: equal to the reference to rounding) or by the fast kernels (dion/train/kernels.h:
// oneDNN GEMMs on CPU, the lm_head and cross entropy fused and chunked).
//
// Mixture of experts (GPTConfig::moe, dion/train/moe.h): with n_experts > 0 every moe.every-th
// block's MLP is an MoE feed-forward ("transformer.h.<i>.mlp.router.weight" [E, C],
// "mlp.experts.w1" [E, H, C], "mlp.experts.w2" [E, C, H], "mlp.shared.c_fc/c_proj.weight" with
// n_shared_experts, buffer "mlp.expert_bias" [E]); drawn after c_proj in that order.
//
// What it is not: no optimizer, no autocast (the caller sets it up), no collectives itself
// (ModelParallel's are the caller's).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dion/train/kernels.h"

namespace dion::train {

inline constexpr int64_t kVocabSize = 50304;  // GPT-2's 50257 rounded up to a multiple of 128

// How the GPT computes when its parameters are sharded across ranks (dion/train/parallel.h).
class ModelParallel {
 public:
  virtual ~ModelParallel() = default;
  // The tensor to compute with for `param` (this rank's part of a TP-split weight, whole
  // otherwise), differentiable back to `param`.
  virtual at::Tensor weight(const at::Tensor& param) = 0;
  // x [.., in] times `param`'s computed weight [out, in] transposed -> [.., out] (at::linear,
  // no bias). The default is at::linear(x, weight(param)); FSDP with reshard_after_forward
  // overrides it so that the gathered weight is not kept for backward.
  virtual at::Tensor linear(const at::Tensor& x, const at::Tensor& param);
  // Entering a TP region: identity forward, gradient summed over TP ranks in backward.
  virtual at::Tensor tp_enter(const at::Tensor& x) = 0;
  // Leaving a TP region (after a row-parallel matmul): sum over TP ranks forward, identity backward.
  virtual at::Tensor tp_exit(const at::Tensor& x) = 0;
  virtual int64_t tp_size() const = 0;
  // Expert parallelism (dion/train/moe.h): this rank holds experts [ep_rank * E / ep, +E / ep).
  virtual int64_t ep_size() const { return 1; }
  virtual int64_t ep_rank() const { return 0; }
  // Expert parallelism's exchange, issued now, not differentiable (moe.cpp computes while the
  // rows travel and sends the gradients back itself): send[j] rows of x (in order) to ep rank j;
  // the returned function waits and gives recv[i] rows from each rank i, in rank order. Every ep
  // rank issues its exchanges in the same order. The default (one rank) gives x.
  using Pending = std::function<at::Tensor()>;
  virtual Pending ep_start(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv);
  // The same for int64 counts [ep * n]: chunk j goes to ep rank j; chunk i of the result came from rank i.
  virtual Pending ep_start_counts(const at::Tensor& counts);

  Kernels kernels = Kernels::exact;  // what the default linear() computes with (set by GPT::set_parallel)
};

// The mixture-of-experts feed-forward (dion/train/moe.h); n_experts 0: the dense MLP everywhere.
struct MoEConfig {
  int64_t n_experts = 0;         // routed experts per MoE layer
  int64_t top_k = 2;             // experts per token
  int64_t expert_dim = 0;        // one expert's hidden size (resolved by the trainer when 0)
  int64_t n_shared_experts = 0;  // always-on experts (one MLP of n_shared x expert_dim hidden)
  int64_t every = 1;             // block i is MoE when (i + 1) % every == 0
  bool sigmoid = false;          // router scores: softmax over experts (false) or sigmoid
  double aux_loss_coef = 0;      // sequence-wise balance loss (DeepSeek-V3), 0: none
  bool on_layer(int64_t i) const { return n_experts > 0 && (i + 1) % every == 0; }
};

struct GPTConfig {
  int64_t sequence_len = 1024;
  int64_t vocab_size = kVocabSize;
  int64_t n_layer = 12;
  int64_t n_head = 6;
  int64_t n_embd = 768;
  bool placeholder_weights = false;  // weights are placeholders until init_weights (see the top)
  Kernels kernels = Kernels::exact;  // see the top
  MoEConfig moe = {};                // see the top
  bool qk_norm = true;               // see the top
  bool track_max_logits = false;     // see the top
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& config);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  // The largest logit of each of this rank's heads [n_head / tp] (float32, -inf before any
  // training forward) since the last call (track_max_logits; undefined without it).
  at::Tensor take_max_logits();

  torch::nn::Linear c_q{nullptr}, c_k{nullptr}, c_v{nullptr}, c_proj{nullptr};
  std::shared_ptr<ModelParallel> parallel;  // null: whole weights

 private:
  int64_t n_head_, head_dim_;
  Kernels kernels_;
  bool qk_norm_, track_;
  at::Tensor max_logits_;
  void track_max_logits(const at::Tensor& q, const at::Tensor& k);
  // rotary_cos_sin for the last sequence length and device, computed once (its host-side
  // arange and copy to the device cannot run inside a CUDA-graph capture; train/graphed_step.h)
  at::Tensor cos_, sin_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& config, int64_t hidden = 0);  // hidden 0: 4 x n_embd
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  std::shared_ptr<ModelParallel> parallel;  // null: whole weights

 private:
  Kernels kernels_;
};
TORCH_MODULE(MLP);

class MoEImpl;  // dion/train/moe.h

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x);

  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};               // the dense MLP, or null in an MoE block
  std::shared_ptr<MoEImpl> moe;   // the MoE feed-forward (registered as "mlp"), or null

 private:
  Kernels kernels_;  // the norms' (fast: one-pass RMSNorm on the CPU)
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& config);

  // The reference's init_weights (see the top of this file). Call under the seed you want.
  // keep(name, full) -> the tensor `name` holds from now on (default: `full` itself).
  using KeepFn = std::function<at::Tensor(const std::string& name, const at::Tensor& full)>;
  void init_weights(const KeepFn& keep = nullptr);

  // Mean cross entropy over idx/targets [B, T] (targets -1 ignored), fp32 0-d.
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);
  // fp32 logits [B, T, V] for every position.
  at::Tensor logits(const at::Tensor& idx);

  // The parameters, split as the reference's init_optimizer splits them.
  std::vector<at::Tensor> block_params();  // transformer.h.* (matrices)
  at::Tensor embedding_weight() { return wte->weight; }
  at::Tensor lm_head_weight() { return lm_head->weight; }
  // The blocks' attentions, in order (QK-clip reads their c_q, c_k and maxima).
  std::vector<CausalSelfAttention> attentions() const;
  // Mixture of experts (empty / no-ops for a dense GPT).
  std::vector<std::shared_ptr<MoEImpl>> moe_layers() const;
  std::vector<at::Tensor> router_params();  // every MoE layer's router weight
  // Tokens this rank routed to each expert since the last call, int64 [MoE layers, E]; resets.
  at::Tensor take_expert_load();
  // The auxiliary-loss-free balancing step (DeepSeek-V3) from the GLOBAL load [MoE layers, E]:
  // expert_bias += rate * sign(mean - load), centred to mean 0.
  void update_expert_bias(const at::Tensor& load, double rate);
  // Seconds spent routing tokens since the last call (dispatch and combine, MoEImpl::
  // take_route_seconds, plus the expert-parallel exchanges of backward); resets.
  double take_route_seconds();

  const GPTConfig& config() const { return config_; }

  // Compute through `parallel` from now on (nullptr: whole weights). The parameters themselves
  // are resharded by the caller (dion/train/parallel.h).
  void set_parallel(std::shared_ptr<ModelParallel> parallel);
  const std::shared_ptr<ModelParallel>& parallel() const { return parallel_; }

 private:
  at::Tensor hidden(const at::Tensor& idx);  // final-normed hidden states [B, T, C]

  GPTConfig config_;
  std::shared_ptr<torch::nn::Module> transformer_;  // holds wte and h, for the reference's names
  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<Block> blocks_;
  torch::nn::Linear lm_head{nullptr};
  std::shared_ptr<ModelParallel> parallel_;
};
TORCH_MODULE(GPT);

// Rotary cos/sin for T positions and head size D: [T, D/2] each, rounded to bf16 as the
// reference does (Rotary.forward), on `device`.
std::pair<at::Tensor, at::Tensor> rotary_cos_sin(int64_t T, int64_t D, at::Device device);
// The reference's apply_rotary_emb: x [B, T, H, D], cos/sin [T, D/2] -> [B, T, H, D] in x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Parameters of a GPT with this shape (the reference's count; 162,201,600 for 768 x 12), and
// those one token computes with (an MoE's top_k routed experts of n_experts; = the count when dense).
int64_t gpt_param_count(const GPTConfig& config);
int64_t gpt_active_param_count(const GPTConfig& config);

// At start-up, before any weight exists: throws ConfigError naming model_dim, n_layer and
// vocab_size when training this model on a CPU could not fit in this machine's memory — its
// parameters, gradients and two optimizer state tensors in fp32 (16 bytes a parameter), split
// over `shards` processes at best, against the physical memory (src/train/model/fit.cpp). A clear
// error instead of the allocator's at the first weight. On CUDA nothing is checked here.
void gpt_check_fits_memory(const GPTConfig& config, const at::Device& device, int shards);

}  // namespace dion::train
