// dion/math/qk_clip.h — QK-clip (Kimi K2's MuonClip): after the optimizer's update, every attention
// head whose largest pre-softmax logit S_h went above tau has its query and key projections scaled
// so that the same inputs would give tau.
//
//   gamma_h = min(1, tau / S_h)                       (a head at or below tau: 1, untouched)
//   as many key heads as query heads (MHA):  W_q^h *= sqrt(gamma_h),  W_k^h *= sqrt(gamma_h)
//   a key head shared by g = n_heads / n_kv_heads query heads (GQA, MQA):  W_q^h *= gamma_h, W_k kept
//
// Both scale head h's logits q_h . k_h by exactly gamma_h (rotary embeddings are linear in q and
// k). W_q^h are rows h * head_dim .. (h + 1) * head_dim - 1 of the [n_heads * head_dim, in] weight,
// torch's Linear layout with the heads major, as nn.MultiheadAttention, torchtitan and dion-train
// lay them out. A model that normalizes q and k after the projections (QK norm) bounds its logits
// already, and scaling W_q there changes nothing the softmax sees: QK-clip is for models without.
//
// S_h is the caller's: the largest q . k / sqrt(head_dim) (with whatever scale the softmax's input
// has) over the batch's positions, as the attention computed it. dion/optim/qk_clip.h combines it
// over the ranks and applies these functions to each rank's part of the weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::math {

// gamma = min(1, tau / S) elementwise (float64, same shape as max_logits); S = -inf (a head no
// rank computed): 1. A NaN or +inf S is the caller's to refuse (qk_clip.h does, naming the head).
at::Tensor qk_clip_factors(const at::Tensor& max_logits, double tau);

// w[i, :] *= factor[rows[i] / head_dim] ^ power for every local row i of `w` (in place; any float
// dtype, the factor rounded once to w's dtype). rows: int64 [w.size(0)], the global row index of
// each local row (a shard's rows, or the interleaved rows of a strided shard); undefined: 0, 1, ...
void scale_head_rows_(at::Tensor& w, const at::Tensor& rows, const at::Tensor& factor, int64_t head_dim,
                      double power);

}  // namespace dion::math
