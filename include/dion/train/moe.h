// dion/train/moe.h — the mixture-of-experts feed-forward of dion-train's GPT (gpt.h), with
// expert parallelism through ModelParallel.
//
//   x [B, T, C] -> tokens [N, C] (N = B x T)
//   router:  scores = softmax(x Wr^T) or sigmoid(x Wr^T)            Wr [E, C], fp32 scores [N, E]
//            experts = top_k(scores + expert_bias)                 the bias only selects (no grad)
//            weights = scores of those experts / their sum         renormalised, [N, top_k]
//   experts: y_t = sum_k weights[t, k] * W2[e] relu(W1[e] x_t)^2   W1 [E, H, C], W2 [E, C, H]
//            dropless: every token reaches its top_k experts (no capacity, no dropped tokens)
//   shared:  + the dense MLP of n_shared_experts x H hidden, on every token (when n_shared > 0)
//
// In the fast kind on the CPU the router's scores, top-k and renormalisation are one pass a token,
// each way (src/train/model/router_cpu.h; fp32 rounding of ATen's ops, which the exact kind runs).
// Tokens are grouped by expert (a counting sort: token order within an expert) and each expert runs
// one GEMM pair on its group, all experts in one autograd node that writes the GEMMs into shared
// buffers (moe.cpp GroupedExpertsFn; a loop of per-expert linears was 1.5x slower). Not a padded batched GEMM: on one CPU thread (AMD Zen 5, torch 2.11,
// fp32, C 128, H 170, max / mean load 1.14) bmm over experts padded to the fullest took 1.65x the
// loop's time at 8 experts x 1024 rows and 0.94x at 64 experts x 16 rows (2026-12-05); ATen's
// grouped GEMM (_grouped_mm) is CUDA-only. Under expert parallelism (ModelParallel::ep_size() > 1) this rank
// holds experts [ep_rank * E / ep, +E / ep) of the stacks: the counts per expert go to their
// ranks first (one all_to_all, while the shared experts compute), then the tokens (an all_to_all
// with those split sizes), each rank runs its experts on what it received, and the results come
// back the same way; backward sends the gradients along the reverse path. One autograd node
// holds the exchanges and the experts (moe.cpp EpExpertsFn): a rank's own tokens for its own
// experts compute while the other ranks' travel, both ways, so that a rank that arrives first
// works instead of waiting. The collectives are issued in layer order in forward and reverse
// layer order in backward, the same on every rank.
//
// Load balancing: the auxiliary-loss-free bias (DeepSeek-V3): the trainer sums the tokens routed
// to each expert over the step and over every data-parallel rank and calls
// GPT::update_expert_bias (bias_i += rate x sign(mean - load_i), centred). Optionally a
// sequence-wise balance loss, aux_loss_coef x sum_i f_i P_i per sequence (f_i: E / (top_k T) x
// tokens of the sequence routed to i; P_i: mean normalised score of i), averaged over sequences,
// added to the loss while training. Both are independent of the parallel layout.
//
// What it is not: the optimizer's view of the stacks (each expert's matrix is orthogonalized
// apart, docs/train.md "Mixture of experts"), collectives of its own.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>

#include "dion/train/gpt.h"

namespace dion::train {

struct Grouping;  // src/train/model/router_cpu.h

class MoEImpl : public torch::nn::Module {
 public:
  explicit MoEImpl(const GPTConfig& config);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  torch::nn::Linear router{nullptr};  // [E, C]
  at::Tensor w1, w2;                  // "experts.w1" [E, H, C], "experts.w2" [E, C, H] (this rank's experts under EP)
  MLP shared{nullptr};                // n_shared_experts x H hidden, or null
  at::Tensor expert_bias;             // buffer [E] fp32: added to the scores for the top_k selection only
  std::shared_ptr<ModelParallel> parallel;  // null: one process holds every expert

  // Tokens routed to each expert by training forwards since the last take_load(), int64 [E]; resets.
  at::Tensor take_load();
  // Seconds the forwards since the last call spent routing (moe.h: dispatch = grouping the tokens by
  // expert and sending them to their experts' ranks, combine = the way back and the weighted sum),
  // not the experts' GEMMs; resets. Host wall clock (on CUDA: the host's side only).
  double take_route_seconds();
  // The last training forward's balance loss x aux_loss_coef (0-d fp32), undefined when off.
  const at::Tensor& aux_loss() const { return aux_loss_; }
  const MoEConfig& config() const { return cfg_; }
  int64_t expert_dim() const { return hidden_; }

 private:
  // The routed experts' output for tokens xf [N, C] with weights w [N, K], their routed rows
  // grouped by expert in `groups` (src/train/model/router_cpu.h), plus what `meanwhile` returns
  // (undefined: nothing), which runs while the tokens travel to their experts (the shared experts'
  // forward, [B, T, C]).
  at::Tensor routed(const at::Tensor& xf, const Grouping& groups, const at::Tensor& w,
                    const std::function<at::Tensor()>& meanwhile);
  // Rows xs in blocks, block i counts[i] rows for local expert experts[i], through their experts.
  at::Tensor grouped(const at::Tensor& xs, const std::vector<int64_t>& experts, const std::vector<int64_t>& counts);

  MoEConfig cfg_;
  int64_t hidden_;
  Kernels kernels_;
  at::Tensor load_;
  at::Tensor aux_loss_;
  double route_s_ = 0;
};

}  // namespace dion::train
