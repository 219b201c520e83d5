// src/train/model/router_cpu.h — the MoE router's scores (softmax or sigmoid), top-k selection
// and renormalized weights as one pass per token, and the grouping of routed rows by expert (private to
// src/train/model; moe.cpp uses them on the CPU).
//
//   route_topk_fused(logits [N, E] fp32, bias [E] fp32, K, sigmoid) -> {scores, sel, w}:
//     scores = softmax(logits, -1), or sigmoid(logits)   [N, E], differentiable
//     sel    = topk(scores + bias, K, largest, sorted)   [N, K] int64 (ties: the lower expert first)
//     w      = scores.gather(1, sel) / its row sum       [N, K], differentiable
//   One autograd node: backward takes d scores (the balance loss's path; may be absent) and d w in
//   one pass per token: d scores[sel_j] += (dw_j - sum_k dw_k w_k) / S, S the selected scores' sum,
//   then softmax's backward p (g - p . g), or sigmoid's g (1 - p) p. ATen's composition (softmax, add, topk, gather, sum,
//   div and their backward: gather's zero-filled scatter, the div's two products) is ~9 kernels
//   over [N, E] or [N, K] tensors of 8 experts, each with its own allocation and dispatch: ~1 ms
//   a layer forward + backward at 2048 tokens (one Xeon thread, 2026-12-06), for ~20 us of math.
//   Values: equal to the composition to fp32 rounding, not bit for bit: the exp is Sleef's 8-lane
//   expf where the CPU has AVX2 (as ATen's AVX2 kernels; libm's elsewhere), the row's sum and the
//   normalization run in another order; the selection is the composition's where the scores are
//   not tied to rounding (tests/train/model/test_router_cpu.cpp).
//
//   group_by_expert(sel [N, K] int64, E) -> {order, token, counts}: order = argsort(sel.flatten(),
//     stable) (the routed rows grouped by expert, token order inside each), token = order // K
//     (each routed row's token), counts[e] = rows of expert e. A counting sort: the same permutation as the stable sort, bit for bit, in two
//     passes; on the CPU only (elsewhere ATen's argsort and bincount).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dion::train {

struct Routing {
  at::Tensor scores, sel, w;
};
// A CPU fp32 logits [N, E] with 1 <= K <= E.
bool router_fused_available(const at::Tensor& logits, int64_t K);
Routing route_topk_fused(const at::Tensor& logits, const at::Tensor& bias, int64_t K, bool sigmoid = false);

struct Grouping {
  at::Tensor order;             // [N K] int64: flat routed-row ids grouped by expert
  at::Tensor token;             // [N K] int64: order // K
  std::vector<int64_t> counts;  // [E]: rows per expert
};
Grouping group_by_expert(const at::Tensor& sel, int64_t E);

}  // namespace dion::train
