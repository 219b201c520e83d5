// src/train/model/router_cpu.cpp — the MoE router's one-pass kernel and the counting sort that
// groups routed rows by expert (router_cpu.h).
#include "router_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <immintrin.h>

#include <cmath>
#include <limits>

#include "fused_cpu.h"

// Sleef's 8-lane expf, 1.0 ULP (what ATen's AVX2 Vectorized<float>::exp calls; LibTorch exports it).
extern "C" __m256 Sleef_expf8_u10(__m256);

namespace dion::train {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kRowsPerTask = 256;  // tokens per parallel_for task (each E floats)

// a ranks before b: larger, NaN largest (as ATen's topk), ties to the lower expert (a < b in id).
inline bool ranks_before(float a, float b) { return a > b || (std::isnan(a) && !std::isnan(b)); }

// p[e] = exp(l[e] - m), 8 lanes at a time where the CPU has AVX2 (tail lanes read m: exp(0)).
__attribute__((target("avx2,fma"))) void exp_shifted_avx2(const float* l, float m, float* p, int64_t E) {
  const __m256 vm = _mm256_set1_ps(m);
  int64_t e = 0;
  for (; e + 8 <= E; e += 8) _mm256_storeu_ps(p + e, Sleef_expf8_u10(_mm256_sub_ps(_mm256_loadu_ps(l + e), vm)));
  if (e == E) return;
  float in[8], out[8];
  for (int64_t j = 0; j < 8; ++j) in[j] = e + j < E ? l[e + j] : m;
  _mm256_storeu_ps(out, Sleef_expf8_u10(_mm256_sub_ps(_mm256_loadu_ps(in), vm)));
  for (int64_t j = 0; e + j < E; ++j) p[e + j] = out[j];
}
void exp_shifted(const float* l, float m, float* p, int64_t E) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return exp_shifted_avx2(l, m, p, E);
  for (int64_t e = 0; e < E; ++e) p[e] = std::exp(l[e] - m);
}

// Token i's scores, selection and weights: p [E], sel [K], w [K]. Softmax: a NaN logit makes the
// token's scores NaN (exp(NaN - m) enters the sum), as ATen's softmax; sigmoid: 1 / (1 + exp(-l)).
void route_row(const float* l, const float* bias, float* p, int64_t* sel, float* w, int64_t E, int64_t K,
               bool sigmoid) {
  if (sigmoid) {
    for (int64_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-l[e]));
  } else {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < E; ++e) m = l[e] > m ? l[e] : m;
    exp_shifted(l, m, p, E);
    float s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[e];
    const float r = 1.0f / s;
    for (int64_t e = 0; e < E; ++e) p[e] *= r;
  }
  // Insertion into the K best so far (sorted, best first); a later expert passes only a strictly
  // better one, so ties keep the lower expert first.
  float best[64];
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float v = p[e] + bias[e];
    if (n == K && !ranks_before(v, best[K - 1])) continue;
    int64_t j = n < K ? n++ : K - 1;
    while (j > 0 && ranks_before(v, best[j - 1])) {
      best[j] = best[j - 1];
      sel[j] = sel[j - 1];
      --j;
    }
    best[j] = v;
    sel[j] = e;
  }
  float S = 0;
  for (int64_t j = 0; j < K; ++j) S += p[sel[j]];
  for (int64_t j = 0; j < K; ++j) w[j] = p[sel[j]] / S;
}

struct RouterFn : torch::autograd::Function<RouterFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& bias, int64_t K,
                               bool sigmoid) {
    const at::Tensor l = logits.contiguous();
    const int64_t N = l.size(0), E = l.size(1);
    const at::Tensor b = bias.to(at::kFloat).contiguous();
    at::Tensor scores = at::empty({N, E}, l.options()), w = at::empty({N, K}, l.options());
    at::Tensor sel = at::empty({N, K}, l.options().dtype(at::kLong));
    const float *lp = l.const_data_ptr<float>(), *bp = b.const_data_ptr<float>();
    float *pp = scores.data_ptr<float>(), *wp = w.data_ptr<float>();
    int64_t* sp = sel.data_ptr<int64_t>();
    at::parallel_for(0, N, kRowsPerTask, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) route_row(lp + i * E, bp, pp + i * E, sp + i * K, wp + i * K, E, K, sigmoid);
    });
    ctx->mark_non_differentiable({sel});
    ctx->saved_data["sigmoid"] = sigmoid;
    ctx->save_for_backward({scores, sel, w});
    return {scores, sel, w};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &scores = saved[0], &sel = saved[1], &w = saved[2];
    const int64_t N = scores.size(0), E = scores.size(1), K = sel.size(1);
    const at::Tensor gs = grads[0].defined() ? grads[0].contiguous() : at::Tensor();
    const at::Tensor gw = grads[2].defined() ? grads[2].contiguous() : at::Tensor();
    at::Tensor dl = at::empty({N, E}, scores.options());
    const float *pp = scores.const_data_ptr<float>(), *wp = w.const_data_ptr<float>();
    const float* gsp = gs.defined() ? gs.const_data_ptr<float>() : nullptr;
    const float* gwp = gw.defined() ? gw.const_data_ptr<float>() : nullptr;
    const int64_t* sp = sel.const_data_ptr<int64_t>();
    float* dp = dl.data_ptr<float>();
    const bool sigmoid = ctx->saved_data["sigmoid"].toBool();
    at::parallel_for(0, N, kRowsPerTask, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* p = pp + i * E;
        float* g = dp + i * E;  // d scores first, then d logits in place
        for (int64_t e = 0; e < E; ++e) g[e] = gsp ? gsp[i * E + e] : 0.0f;
        if (gwp) {
          const int64_t* s = sp + i * K;
          float S = 0, c = 0;
          for (int64_t j = 0; j < K; ++j) S += p[s[j]];
          for (int64_t j = 0; j < K; ++j) c += gwp[i * K + j] * wp[i * K + j];
          for (int64_t j = 0; j < K; ++j) g[s[j]] += (gwp[i * K + j] - c) / S;
        }
        if (sigmoid) {  // d sigmoid = g (1 - p) p
          for (int64_t e = 0; e < E; ++e) g[e] = g[e] * (1.0f - p[e]) * p[e];
          continue;
        }
        float dot = 0;  // softmax: p (g - p . g)
        for (int64_t e = 0; e < E; ++e) dot += g[e] * p[e];
        for (int64_t e = 0; e < E; ++e) g[e] = p[e] * (g[e] - dot);
      }
    });
    return {dl, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool router_fused_available(const at::Tensor& logits, int64_t K) {
  return logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 && K >= 1 &&
         K <= logits.size(1) && K <= 64;
}

Routing route_topk_fused(const at::Tensor& logits, const at::Tensor& bias, int64_t K, bool sigmoid) {
  TORCH_CHECK(router_fused_available(logits, K), "route_topk_fused: logits [N, E] fp32 on the CPU and ",
              "1 <= K <= min(E, 64); got logits ", logits.sizes(), " ", logits.scalar_type(), " on ", logits.device(),
              ", K ", K);
  TORCH_CHECK(!bias.defined() || (bias.device().is_cpu() && bias.numel() == logits.size(1)),
              "route_topk_fused: bias [E] on the CPU, E = ", logits.size(1), "; got ", bias.sizes());
  // (autograd's apply takes defined tensors only: no bias is a zero one)
  const variable_list out = RouterFn::apply(logits, bias.defined() ? bias : at::zeros({logits.size(1)}), K, sigmoid);
  return {out[0], out[1], out[2]};
}

Grouping group_by_expert(const at::Tensor& sel, int64_t E) {
  Grouping g;
  if (!sel.device().is_cpu()) {  // ATen's stable sort and bincount on the device
    const at::Tensor flat = sel.reshape({-1});
    g.order = at::argsort(flat, /*stable=*/true, 0);
    g.token = at::div(g.order, sel.size(-1), "floor");
    const at::Tensor c = at::bincount(flat.cpu(), {}, E).contiguous();
    g.counts.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    return g;
  }
  const at::Tensor flat = sel.reshape({-1}).to(at::kLong).contiguous();
  const int64_t R = flat.numel(), K = sel.size(-1);
  const RowsByTarget by_expert = rows_by_target(flat.const_data_ptr<int64_t>(), R, E, "MoE routing: expert id");
  g.counts.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) g.counts[size_t(e)] = by_expert.ptr[size_t(e + 1)] - by_expert.ptr[size_t(e)];
  g.order = at::empty({R}, flat.options());
  g.token = at::empty({R}, flat.options());
  int64_t *o = g.order.data_ptr<int64_t>(), *t = g.token.data_ptr<int64_t>();
  for (int64_t i = 0; i < R; ++i) {
    o[i] = by_expert.rows[size_t(i)];
    t[i] = o[i] / K;
  }
  return g;
}

}  // namespace dion::train
