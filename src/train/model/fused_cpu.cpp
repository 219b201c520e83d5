// src/train/model/fused_cpu.cpp — the block's elementwise chains as one pass each (fused_cpu.h).
//
// The loops are plain C++ over fp32 lanes (bf16 read by a shift and written by rounding to nearest
// even with integer ops, as c10::BFloat16 does), compiled as AVX-512, AVX2 and baseline clones
// (target_clones: the CPU picks one at load time). Every clone computes each element by the same
// scalar operations (no reassociation, no fused multiply-add), so all give the same bits.
#include "fused_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>

namespace dion::train {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task

inline float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Round to nearest even; a NaN stays a (quiet) NaN. The select is integer masks, no branch, so
// that the loops around it vectorize.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t nan = (u >> 16) | 0x40u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t is_nan = 0u - uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return uint16_t((rounded & ~is_nan) | (nan & is_nan));
}

// Element access: fp32 as is; bf16 widened to fp32, and each result rounded to bf16 (`round`) as
// ATen's bf16 kernels round every operation's result.
struct F32 {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
  static float round(float v) { return v; }
};
struct BF16 {
  using T = uint16_t;
  static float load(T v) { return from_bf16(v); }
  static T store(float v) { return to_bf16(v); }
  static float round(float v) { return from_bf16(to_bf16(v)); }
};

// Rows r0..r1 of [rows, 2 half]; row r is position t = (r / H) % T. Forward:
//   o1 = a1 c + a2 s, o2 = a1 (-s) + a2 c;
// backward (the same with s negated, and + 0 as the slices' zero-padded gradients are summed):
//   o1 = a1 c + a2 (-s) + 0, o2 = a1 s + a2 c + 0.
// `R` is the rounding of the products and sums: per operation when x and cos/sin are both bf16
// (ATen's bf16 mul and add), none when x is fp32 (bf16 cos/sin promote to fp32 exactly).
template <typename E, typename R>
__attribute__((always_inline)) inline void rotary_body(const typename E::T* x, typename E::T* y, const float* c,
                                                       const float* s, int64_t r0, int64_t r1, int64_t T, int64_t H,
                                                       int64_t half, bool backward) {
  const float sign = backward ? -1.0f : 1.0f;
  const float zero = backward ? 0.0f : -0.0f;  // x + -0.0 == x for every x, -0 included
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = (r / H) % T;
    const float* ct = c + t * half;
    const float* st = s + t * half;
    const typename E::T* a = x + r * 2 * half;
    typename E::T* o = y + r * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a1 = E::load(a[i]), a2 = E::load(a[half + i]);
      const float cc = ct[i], sp = sign * st[i], sm = -sp;  // sp: s forward, -s backward
      const float o1 = R::round(R::round(a1 * cc) + R::round(a2 * sp));
      const float o2 = R::round(R::round(a1 * sm) + R::round(a2 * cc));
      o[i] = E::store(o1 + zero);
      o[half + i] = E::store(o2 + zero);
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void rotary_f32(const float* x, float* y, const float* c,
                                                                              const float* s, int64_t r0, int64_t r1,
                                                                              int64_t T, int64_t H, int64_t half,
                                                                              bool backward) {
  rotary_body<F32, F32>(x, y, c, s, r0, r1, T, H, half, backward);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void rotary_bf16(const uint16_t* x, uint16_t* y,
                                                                               const float* c, const float* s,
                                                                               int64_t r0, int64_t r1, int64_t T,
                                                                               int64_t H, int64_t half, bool backward) {
  rotary_body<BF16, BF16>(x, y, c, s, r0, r1, T, H, half, backward);
}

// relu(a)^2: r = relu(a) (a NaN stays NaN, as ATen's clamp_min), y = r r.
inline float relu(float v) { return v <= 0.0f ? 0.0f : v; }
template <typename E>
__attribute__((always_inline)) inline void relu_square_body(const typename E::T* a, typename E::T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = relu(E::load(a[i]));
    y[i] = E::store(r * r);
  }
}
// Backward: pow's 2 r (exact) times dy, then relu's threshold: 0 where r <= 0. Where a > 0 or a
// is NaN, r = a, so one select on a does both.
template <typename E>
__attribute__((always_inline)) inline void relu_square_grad_body(const typename E::T* a, const typename E::T* g,
                                                                 typename E::T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = E::load(a[i]);
    const float d = E::load(g[i]) * (2.0f * v);
    out[i] = E::store(v <= 0.0f ? 0.0f : d);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_square_f32(const float* a, float* y, int64_t n) {
  relu_square_body<F32>(a, y, n);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_square_bf16(const uint16_t* a, uint16_t* y,
                                                                                    int64_t n) {
  relu_square_body<BF16>(a, y, n);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_square_grad_f32(const float* a, const float* g,
                                                                                        float* out, int64_t n) {
  relu_square_grad_body<F32>(a, g, out, n);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_square_grad_bf16(const uint16_t* a,
                                                                                         const uint16_t* g,
                                                                                         uint16_t* out, int64_t n) {
  relu_square_grad_body<BF16>(a, g, out, n);
}

// RMSNorm over rows of C: per row, s = sum x^2 in 16 fp32 lanes (GCC vector types: one order of
// additions on every clone), r = 1 / sqrt(s / C + eps); forward y = x r; backward (dy, x, r):
// dx = r dy - x r^3 (sum dy x) / C. Each row is read once per pass; results are fp32, rounded to
// bf16 on store for bf16 rows. ATen sums x^2 in another order, so the results differ from its
// composition by fp32 rounding (tests/train/model/test_fused_cpu.cpp says how far).
typedef float v16f __attribute__((vector_size(64)));
template <typename E>
__attribute__((always_inline)) inline float row_dot(const typename E::T* a, const typename E::T* b, int64_t C) {
  v16f acc = {};
  int64_t i = 0;
  for (; i + 16 <= C; i += 16) {
    v16f x, y;
    for (int j = 0; j < 16; ++j) x[j] = E::load(a[i + j]), y[j] = E::load(b[i + j]);
    acc += x * y;
  }
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += acc[j];
  for (; i < C; ++i) s += E::load(a[i]) * E::load(b[i]);
  return s;
}
template <typename E>
__attribute__((always_inline)) inline void rms_norm_body(const typename E::T* x, typename E::T* y, float* rstd,
                                                         int64_t r0, int64_t r1, int64_t C, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const typename E::T* xr = x + r * C;
    typename E::T* yr = y + r * C;
    const float rs = 1.0f / std::sqrt(row_dot<E>(xr, xr, C) / float(C) + eps);
    rstd[r] = rs;
    for (int64_t i = 0; i < C; ++i) yr[i] = E::store(E::load(xr[i]) * rs);
  }
}
template <typename E>
__attribute__((always_inline)) inline void rms_norm_grad_body(const typename E::T* x, const typename E::T* dy,
                                                              const float* rstd, typename E::T* dx, int64_t r0,
                                                              int64_t r1, int64_t C) {
  for (int64_t r = r0; r < r1; ++r) {
    const typename E::T* xr = x + r * C;
    const typename E::T* gr = dy + r * C;
    typename E::T* dr = dx + r * C;
    const float rs = rstd[r];
    const float k = rs * rs * rs * row_dot<E>(gr, xr, C) / float(C);
    for (int64_t i = 0; i < C; ++i) dr[i] = E::store(rs * E::load(gr[i]) - k * E::load(xr[i]));
  }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void rms_norm_f32(const float* x, float* y, float* rstd,
                                                                                int64_t r0, int64_t r1, int64_t C,
                                                                                float eps) {
  rms_norm_body<F32>(x, y, rstd, r0, r1, C, eps);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void rms_norm_bf16(const uint16_t* x, uint16_t* y,
                                                                                 float* rstd, int64_t r0, int64_t r1,
                                                                                 int64_t C, float eps) {
  rms_norm_body<BF16>(x, y, rstd, r0, r1, C, eps);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void rms_norm_grad_f32(const float* x, const float* dy,
                                                                                     const float* rstd, float* dx,
                                                                                     int64_t r0, int64_t r1,
                                                                                     int64_t C) {
  rms_norm_grad_body<F32>(x, dy, rstd, dx, r0, r1, C);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void rms_norm_grad_bf16(const uint16_t* x,
                                                                                      const uint16_t* dy,
                                                                                      const float* rstd, uint16_t* dx,
                                                                                      int64_t r0, int64_t r1,
                                                                                      int64_t C) {
  rms_norm_grad_body<BF16>(x, dy, rstd, dx, r0, r1, C);
}

bool cpu_float(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

// One pass of the rotary over x [B, T, H, D] (contiguous) with fp32 cos/sin tables [T, D/2].
at::Tensor rotary_pass(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s, bool backward) {
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t T = xc.size(1), H = xc.size(2), half = xc.size(3) / 2;
  const int64_t rows = xc.numel() / (2 * half);
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const bool bf16 = xc.scalar_type() == at::kBFloat16;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / (2 * half)), [&](int64_t r0, int64_t r1) {
    if (bf16)
      rotary_bf16(reinterpret_cast<const uint16_t*>(xc.const_data_ptr()), reinterpret_cast<uint16_t*>(y.data_ptr()),
                  cp, sp, r0, r1, T, H, half, backward);
    else
      rotary_f32(xc.const_data_ptr<float>(), y.data_ptr<float>(), cp, sp, r0, r1, T, H, half, backward);
  });
  return y;
}

struct RotaryFn : torch::autograd::Function<RotaryFn> {
  // c, s: fp32 [T, D/2] (converted from the bf16 tables exactly), no gradient.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
    ctx->save_for_backward({c, s});
    return rotary_pass(x, c, s, /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotary_pass(grads[0], saved[0], saved[1], /*backward=*/true), at::Tensor(), at::Tensor()};
  }
};

struct ReluSquareFn : torch::autograd::Function<ReluSquareFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a) {
    const at::Tensor ac = a.contiguous();
    ctx->save_for_backward({ac});
    at::Tensor y = at::empty_like(ac, at::MemoryFormat::Contiguous);
    relu_square_out(ac, y);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor a = ctx->get_saved_variables()[0];
    at::Tensor out = at::empty_like(a, at::MemoryFormat::Contiguous);
    relu_square_grad_out(a, grads[0], out);
    return {out};
  }
};

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const at::Tensor xc = x.contiguous();
    const int64_t C = xc.size(-1), rows = C ? xc.numel() / C : 0;
    const bool bf16 = xc.scalar_type() == at::kBFloat16;
    // F.rms_norm with eps=None: ATen takes the epsilon of its compute type, fp32, for bf16 rows too
    const float eps = std::numeric_limits<float>::epsilon();
    at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
    at::Tensor rstd = at::empty({rows}, xc.options().dtype(at::kFloat));
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
      if (bf16)
        rms_norm_bf16(reinterpret_cast<const uint16_t*>(xc.const_data_ptr()), reinterpret_cast<uint16_t*>(y.data_ptr()),
                      rstd.data_ptr<float>(), r0, r1, C, eps);
      else
        rms_norm_f32(xc.const_data_ptr<float>(), y.data_ptr<float>(), rstd.data_ptr<float>(), r0, r1, C, eps);
    });
    ctx->save_for_backward({xc, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& rstd = saved[1];
    const at::Tensor g = grads[0].to(x.scalar_type()).contiguous();
    const int64_t C = x.size(-1), rows = rstd.numel();
    at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
      if (bf16)
        rms_norm_grad_bf16(reinterpret_cast<const uint16_t*>(x.const_data_ptr()),
                           reinterpret_cast<const uint16_t*>(g.const_data_ptr()), rstd.const_data_ptr<float>(),
                           reinterpret_cast<uint16_t*>(dx.data_ptr()), r0, r1, C);
      else
        rms_norm_grad_f32(x.const_data_ptr<float>(), g.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
                          dx.data_ptr<float>(), r0, r1, C);
    });
    return {dx};
  }
};

// The MoE's row gather (dispatch) and weighted row scatter (combine), fp32, each one autograd
// node. Every sum into a target row runs in row order, as ATen's index_add (its CPU kernel sorts
// the index stably and sums each target's rows in their order), so those are ATen's bits. The sums
// run target by target (each output row written once, from 0, its rows in ascending order: a
// stable counting sort of the index), not as a scatter into a zero-filled output.
}  // namespace

RowsByTarget rows_by_target(const int64_t* index, int64_t R, int64_t N, const char* what) {
  RowsByTarget g;
  g.ptr.assign(size_t(N + 1), 0);
  for (int64_t i = 0; i < R; ++i) {
    TORCH_CHECK(index[i] >= 0 && index[i] < N, what, ": index ", index[i], " out of [0, ", N, ")");
    ++g.ptr[size_t(index[i] + 1)];
  }
  for (int64_t t = 0; t < N; ++t) g.ptr[size_t(t + 1)] += g.ptr[size_t(t)];
  g.rows.resize(size_t(R));
  std::vector<int64_t> next(g.ptr.begin(), g.ptr.end() - 1);
  for (int64_t i = 0; i < R; ++i) g.rows[size_t(next[size_t(index[i])]++)] = i;
  return g;
}

namespace {

// dst[t] = 0 + src[r0] w[r0] + src[r1] w[r1] + ... (+ plus[t]) for targets t0..t1 (w null: x * 1 == x,
// the unweighted sum's bits; plus null: none).
__attribute__((target_clones("avx512f", "avx2", "default"))) void sum_rows_simd(
    const float* __restrict__ src, const float* __restrict__ w, const int64_t* __restrict__ ptr,
    const int64_t* __restrict__ rows, const float* __restrict__ plus, float* __restrict__ dst, int64_t t0, int64_t t1,
    int64_t C) {
  for (int64_t t = t0; t < t1; ++t) {
    float* __restrict__ d = dst + t * C;
    for (int64_t c = 0; c < C; ++c) d[c] = 0.0f;
    for (int64_t p = ptr[t]; p < ptr[t + 1]; ++p) {
      const float* __restrict__ x = src + rows[p] * C;
      const float wi = w ? w[rows[p]] : 1.0f;
      for (int64_t c = 0; c < C; ++c) d[c] += x[c] * wi;
    }
    if (plus)
      for (int64_t c = 0; c < C; ++c) d[c] += plus[t * C + c];
  }
}
// out [N, C] (written whole) = zeros.index_add(0, index, src * w[:, None]) (+ plus).
void sum_rows(const float* src, const float* w, const int64_t* index, const float* plus, float* out, int64_t R,
              int64_t C, int64_t N) {
  const RowsByTarget g = rows_by_target(index, R, N, "MoE row scatter");
  at::parallel_for(0, N, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)), [&](int64_t t0, int64_t t1) {
    sum_rows_simd(src, w, g.ptr.data(), g.rows.data(), plus, out, t0, t1, C);
  });
}
// Rows i0..i1 of the combine's backward: drows[i] = dy[index[i]] w[i], dw[i] = dy[index[i]] . rows[i].
__attribute__((target_clones("avx512f", "avx2", "default"))) void weighted_rows_grad(
    const float* __restrict__ rows, const float* __restrict__ w, const float* __restrict__ dy,
    const int64_t* __restrict__ index, float* __restrict__ drows, float* __restrict__ dw, int64_t i0, int64_t i1,
    int64_t C) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* __restrict__ g = dy + index[i] * C;
    const float wi = w[i];
    float* __restrict__ o = drows + i * C;
    for (int64_t c = 0; c < C; ++c) o[c] = g[c] * wi;
    dw[i] = row_dot<F32>(g, rows + i * C, C);
  }
}

// y [R, C] = x[index]; backward dx [N, C] = 0, dx[index[i]] += dy[i].
struct GatherRowsFn : torch::autograd::Function<GatherRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& index) {
    ctx->save_for_backward({index});
    ctx->saved_data["n"] = x.size(0);
    return x.index_select(0, index);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor index = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].contiguous();
    const int64_t N = ctx->saved_data["n"].toInt(), R = g.size(0), C = g.size(1);
    at::Tensor dx = at::empty({N, C}, g.options());
    sum_rows(g.const_data_ptr<float>(), nullptr, index.const_data_ptr<int64_t>(), nullptr, dx.data_ptr<float>(), R, C,
             N);
    return {dx, at::Tensor()};
  }
};

// y [N, C] = 0, y[index[i]] += rows[i] w[i] (+ plus); backward drows[i] = dy[index[i]] w[i] (ATen's bits),
// dw[i] = dy[index[i]] . rows[i] (16 fp32 lanes: fp32 rounding of ATen's sum), dplus = dy.
struct WeightedScatterRowsFn : torch::autograd::Function<WeightedScatterRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& w,
                            const at::Tensor& index, int64_t N, const at::Tensor& plus) {
    const at::Tensor r = rows.contiguous(), wc = w.contiguous();
    const at::Tensor pc = plus.numel() > 0 ? plus.contiguous() : at::Tensor();  // [N, C]
    const int64_t R = r.size(0), C = r.size(1);
    at::Tensor y = at::empty({N, C}, r.options());
    sum_rows(r.const_data_ptr<float>(), wc.const_data_ptr<float>(), index.const_data_ptr<int64_t>(),
             pc.defined() ? pc.const_data_ptr<float>() : nullptr, y.data_ptr<float>(), R, C, N);
    ctx->saved_data["plus"] = pc.defined();
    ctx->save_for_backward({r, wc, index});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &r = saved[0], &w = saved[1], &ix = saved[2];
    const at::Tensor g = grads[0].contiguous();
    const int64_t R = r.size(0), C = r.size(1);
    at::Tensor dr = at::empty_like(r), dw = at::empty_like(w);
    const float *rp = r.const_data_ptr<float>(), *wp = w.const_data_ptr<float>(), *gp = g.const_data_ptr<float>();
    const int64_t* ip = ix.const_data_ptr<int64_t>();
    float *drp = dr.data_ptr<float>(), *dwp = dw.data_ptr<float>();
    at::parallel_for(0, R, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)),
                     [&](int64_t i0, int64_t i1) { weighted_rows_grad(rp, wp, gp, ip, drp, dwp, i0, i1, C); });
    return {dr, dw, at::Tensor(), at::Tensor(), ctx->saved_data["plus"].toBool() ? g : at::Tensor()};
  }
};

}  // namespace

void relu_square_out(const at::Tensor& a, const at::Tensor& out) {
  TORCH_CHECK(cpu_float(a) && a.is_contiguous() && out.is_contiguous() && out.sizes() == a.sizes() &&
                  out.scalar_type() == a.scalar_type(),
              "relu_square_out: contiguous CPU tensors of one shape, fp32 or bf16");
  const bool bf16 = a.scalar_type() == at::kBFloat16;
  at::parallel_for(0, a.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (bf16)
      relu_square_bf16(reinterpret_cast<const uint16_t*>(a.const_data_ptr()) + b,
                       reinterpret_cast<uint16_t*>(out.data_ptr()) + b, e - b);
    else
      relu_square_f32(a.const_data_ptr<float>() + b, out.data_ptr<float>() + b, e - b);
  });
}

void relu_square_grad_out(const at::Tensor& a, const at::Tensor& dy, const at::Tensor& out) {
  TORCH_CHECK(cpu_float(a) && a.is_contiguous() && out.is_contiguous() && out.sizes() == a.sizes() &&
                  out.scalar_type() == a.scalar_type() && dy.sizes() == a.sizes(),
              "relu_square_grad_out: CPU tensors of one shape, fp32 or bf16, a and out contiguous");
  const at::Tensor g = dy.to(a.scalar_type()).contiguous();
  const bool bf16 = a.scalar_type() == at::kBFloat16;
  at::parallel_for(0, a.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (bf16)
      relu_square_grad_bf16(reinterpret_cast<const uint16_t*>(a.const_data_ptr()) + b,
                            reinterpret_cast<const uint16_t*>(g.const_data_ptr()) + b,
                            reinterpret_cast<uint16_t*>(out.data_ptr()) + b, e - b);
    else
      relu_square_grad_f32(a.const_data_ptr<float>() + b, g.const_data_ptr<float>() + b, out.data_ptr<float>() + b,
                           e - b);
  });
}

bool fused_available(const at::Tensor& x) { return cpu_float(x); }

// A bf16 x with fp32 tables computes in fp32 and rounds once at the end in ATen: not this kernel.
bool rotary_fused_available(const at::Tensor& x, const at::Tensor& cos) {
  return cpu_float(x) && cpu_float(cos) && (x.scalar_type() == at::kFloat || cos.scalar_type() == at::kBFloat16);
}

at::Tensor rotary_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(cpu_float(x) && cpu_float(cos) && cpu_float(sin) && x.dim() == 4 && x.size(3) % 2 == 0 &&
                  cos.dim() == 2 && cos.size(0) == x.size(1) && cos.size(1) == x.size(3) / 2 &&
                  sin.sizes() == cos.sizes(),
              "rotary_fused: x [B, T, H, D] and cos/sin [T, D/2] on the CPU in fp32 or bf16; got x ", x.sizes(), " ",
              x.scalar_type(), ", cos ", cos.sizes(), " ", cos.scalar_type());
  TORCH_CHECK(rotary_fused_available(x, cos), "rotary_fused: a bf16 x needs bf16 cos/sin (got ", cos.scalar_type(),
              ")");
  const at::Tensor c = cos.to(at::kFloat).contiguous(), s = sin.to(at::kFloat).contiguous();
  return RotaryFn::apply(x, c, s);
}

at::Tensor rms_norm_fused(const at::Tensor& x) {
  TORCH_CHECK(cpu_float(x) && x.dim() >= 1, "rms_norm_fused: a CPU tensor of fp32 or bf16, got ", x.scalar_type(),
              " on ", x.device());
  return RmsNormFn::apply(x);
}

bool rows_fused_available(const at::Tensor& x) { return x.device().is_cpu() && x.scalar_type() == at::kFloat; }

at::Tensor gather_rows_fused(const at::Tensor& x, const at::Tensor& index) {
  TORCH_CHECK(rows_fused_available(x) && x.dim() == 2 && index.scalar_type() == at::kLong && index.dim() == 1,
              "gather_rows_fused: x [N, C] fp32 and index [R] int64 on the CPU; got x ", x.sizes(), " ",
              x.scalar_type(), ", index ", index.sizes(), " ", index.scalar_type());
  return GatherRowsFn::apply(x, index.contiguous());
}

at::Tensor weighted_scatter_rows_fused(const at::Tensor& rows, const at::Tensor& w, const at::Tensor& index,
                                       int64_t n, const at::Tensor& plus) {
  TORCH_CHECK(rows_fused_available(rows) && rows.dim() == 2 && w.scalar_type() == at::kFloat && w.dim() == 1 &&
                  w.size(0) == rows.size(0) && index.scalar_type() == at::kLong && index.dim() == 1 &&
                  index.size(0) == rows.size(0),
              "weighted_scatter_rows_fused: rows [R, C] fp32, w [R] fp32, index [R] int64 on the CPU; got rows ",
              rows.sizes(), " ", rows.scalar_type(), ", w ", w.sizes(), ", index ", index.sizes());
  TORCH_CHECK(!plus.defined() || (rows_fused_available(plus) && plus.numel() == n * rows.size(1)),
              "weighted_scatter_rows_fused: plus fp32 on the CPU with ", n, " x ", rows.size(1), " elements; got ",
              plus.defined() ? plus.sizes() : at::IntArrayRef{});
  // (autograd's apply takes defined tensors only: no plus is an empty one)
  return WeightedScatterRowsFn::apply(rows, w, index.contiguous(), n,
                                      plus.defined() ? plus.reshape({n, rows.size(1)}) : at::empty({0}, rows.options()));
}

at::Tensor relu_square_fused(const at::Tensor& a) {
  TORCH_CHECK(cpu_float(a), "relu_square_fused: a CPU tensor of fp32 or bf16, got ", a.scalar_type(), " on ",
              a.device());
  return ReluSquareFn::apply(a);
}

}  // namespace dion::train
