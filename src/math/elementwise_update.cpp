// src/math/elementwise_update.cpp — the fused kernels that update the weights
// (dion/math/elementwise.h): decay and a scaled update (whole, or on selected slices), the step
// along the sign of an interpolated momentum, the orthogonalizers' scaled sums, and (FAST path) the update with per-row variance
// normalization. Each kernel's comment names the ATen composition it reproduces; every
// intermediate is rounded where that composition stores a result.
#include "dion/math/elementwise.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "elementwise_detail.h"

namespace dion::math::cpu {

using namespace detail;  // the element types, lerp, sign and the checks

// ---------------------------------------------------------------------------- decay and update

void decay_and_update_(const at::Tensor& X, const at::Tensor& U, float decay, float neg_lr, bool step_in_x_dtype) {
  TORCH_CHECK(cpu_fusable(X, U), "decay_and_update_: X and U must be contiguous float32 / bfloat16 CPU tensors of ",
              X.numel(), " elements");
  const int64_t n = X.numel();
  with_types(X.scalar_type(), U.scalar_type(), [&](auto tx, auto tu) {
    using TX = decltype(tx);
    using TU = decltype(tu);
    auto* x = ptr<TX>(X);
    const auto* u = ptr<TU>(U);
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      if (step_in_x_dtype) {
        for (int64_t i = begin; i < end; ++i) {
          const float step = TX::round(TX::round(TU::load(u[i])) * neg_lr);
          x[i] = TX::store(TX::round(TX::load(x[i]) * decay) + step);
        }
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const float step = TU::round(TU::load(u[i]) * neg_lr);  // -(U * adjusted_lr): exact negation
          x[i] = TX::store(TX::round(TX::load(x[i]) * decay) + step);
        }
      }
    });
  });
}

namespace {

template <typename T, bool kScaleY>
DION_INLINE void scaled_add_range(const typename T::storage* x, typename T::storage* y, int64_t begin, int64_t end,
                                  float a, float b) {
  for (int64_t i = begin; i < end; ++i) {
    const float py = kScaleY ? T::round(T::load(y[i]) * b) : T::load(y[i]);
    y[i] = T::store(T::round(T::load(x[i]) * a) + py);
  }
}

// The same loop compiled for AVX-512 and AVX2 too, chosen by the CPU at run time: separate
// multiplies and adds (no FMA: -ffp-contract=off) and integer rounding, so every variant gives
// the same bits; only the vector width differs.
template <typename T, bool kScaleY>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64))
__attribute__((target("avx512f,avx512bw")))
#endif
void scaled_add_avx512(const typename T::storage* x, typename T::storage* y, int64_t begin, int64_t end, float a,
                       float b) {
  scaled_add_range<T, kScaleY>(x, y, begin, end, a, b);
}

template <typename T, bool kScaleY>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64))
__attribute__((target("avx2")))
#endif
void scaled_add_avx2(const typename T::storage* x, typename T::storage* y, int64_t begin, int64_t end, float a,
                     float b) {
  scaled_add_range<T, kScaleY>(x, y, begin, end, a, b);
}

enum class Isa { avx512, avx2, baseline };

// The widest the CPU has, capped as ATen's kernels are (ATEN_CPU_CAPABILITY default / avx2), so
// that the tests that cap ATen run every variant here.
Isa vector_isa() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64))
  static const Isa isa = [] {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string c = cap ? cap : "";
    if (c == "default") return Isa::baseline;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && c != "avx2") return Isa::avx512;
    return __builtin_cpu_supports("avx2") ? Isa::avx2 : Isa::baseline;
  }();
  return isa;
#else
  return Isa::baseline;
#endif
}

}  // namespace

void scaled_add_(const at::Tensor& X, float a, const at::Tensor& Y, float b, bool scale_y) {
  TORCH_CHECK(cpu_fusable(X, Y) && X.scalar_type() == Y.scalar_type(),
              "scaled_add_: X and Y must be contiguous CPU tensors of one dtype (float32 / bfloat16) and ", X.numel(),
              " elements");
  const int64_t n = X.numel();
  const Isa isa = vector_isa();
  with_type(X.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const auto* x = ptr<T>(X);
    auto* y = ptr<T>(Y);
    auto run = [&](auto scale) {
      constexpr bool kScale = decltype(scale)::value;
      at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        if (isa == Isa::avx512)
          scaled_add_avx512<T, kScale>(x, y, begin, end, a, b);
        else if (isa == Isa::avx2)
          scaled_add_avx2<T, kScale>(x, y, begin, end, a, b);
        else
          scaled_add_range<T, kScale>(x, y, begin, end, a, b);
      });
    };
    if (scale_y)
      run(std::true_type{});
    else
      run(std::false_type{});
  });
}

void decay_and_update_selected_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& idx, float decay,
                                float neg_lr, int64_t select_dim) {
  const std::vector<int64_t> sel = checked_selection(X, "X", idx, U, select_dim, "decay_and_update_selected_");
  const int64_t rows = X.size(0), cols = X.size(1), k = static_cast<int64_t>(sel.size());
  with_types(X.scalar_type(), U.scalar_type(), [&](auto tx, auto tu) {
    using TX = decltype(tx);
    using TU = decltype(tu);
    auto* x = ptr<TX>(X);
    const auto* u = ptr<TU>(U);
    // x = round(x decay), then x += round(U.to(X) * neg_lr) on the selected slices.
    auto add = [&](typename TX::storage& dst, typename TU::storage src) {
      const float step = TX::round(TX::round(TU::load(src)) * neg_lr);
      dst = TX::store(TX::load(dst) + step);
    };
    at::parallel_for(0, rows, kGrain / std::max<int64_t>(cols, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        auto* xr = x + r * cols;
        for (int64_t c = 0; c < cols; ++c) xr[c] = TX::store(TX::load(xr[c]) * decay);
        if (select_dim == -1) {
          const auto* ur = u + r * k;
          for (int64_t j = 0; j < k; ++j) add(xr[sel[static_cast<size_t>(j)]], ur[j]);
        }
      }
    });
    if (select_dim == -2) {
      for (int64_t j = 0; j < k; ++j) {
        auto* xr = x + sel[static_cast<size_t>(j)] * cols;
        const auto* ur = u + j * cols;
        for (int64_t c = 0; c < cols; ++c) add(xr[c], ur[c]);
      }
    }
  });
}

// ---------------------------------------------------------------------------- sign of the momentum

namespace {

template <typename TX, typename TG, typename TM, bool kFma>
DION_INLINE void sign_step_range(typename TX::storage* x, const typename TG::storage* g_in, typename TM::storage* m,
                                 int64_t begin, int64_t end, float lr, float w1, float w2, float decay) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = TM::round(TG::load(g_in[i]));
    const float m_old = TM::load(m[i]);
    const float s = sign(TM::round(lerp<kFma>(m_old, g, w1)));  // U = lerp(M, g, 1 - b1).sign_()
    m[i] = TM::store(lerp<kFma>(m_old, g, w2));                 // M.lerp_(g, 1 - b2)
    const float step = TM::round(s * lr);                       // U.mul_(lr), in M's dtype
    x[i] = TX::store(TX::round(TX::load(x[i]) * decay) - step);
  }
}

// The FMA variant runs only where ATen's own kernels use FMA instructions (capability AVX2 or
// AVX512, whose CPUs have FMA), compiled for them here so that the FMA is one instruction.
template <typename TX, typename TG, typename TM>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64))
__attribute__((target("avx2,fma")))
#endif
void sign_step_range_fma(typename TX::storage* x, const typename TG::storage* g, typename TM::storage* m,
                         int64_t begin, int64_t end, float lr, float w1, float w2, float decay) {
  sign_step_range<TX, TG, TM, true>(x, g, m, begin, end, lr, w1, w2, decay);
}

}  // namespace

void lion_(const at::Tensor& X, const at::Tensor& G, const at::Tensor& M, float lr, float beta1, float beta2,
           float weight_decay) {
  TORCH_CHECK(cpu_fusable(X, G, M), "lion_: X, G and M must be contiguous float32 / bfloat16 CPU tensors of ",
              X.numel(), " elements");
  const int64_t n = X.numel();
  const bool fma = aten_lerp_uses_fma();
  const float decay = 1.0f - lr * weight_decay;
  with_types(X.scalar_type(), G.scalar_type(), M.scalar_type(), [&](auto tx, auto tg, auto tm) {
    using TX = decltype(tx);
    using TG = decltype(tg);
    using TM = decltype(tm);
    auto* x = ptr<TX>(X);
    const auto* g = ptr<TG>(G);
    auto* m = ptr<TM>(M);
    // lerp's 0-d float32 weight is cast to the common dtype (M's), unlike mul's scalar.
    const float w1 = TM::round(1.0f - beta1), w2 = TM::round(1.0f - beta2);
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      if (fma)
        sign_step_range_fma<TX, TG, TM>(x, g, m, begin, end, lr, w1, w2, decay);
      else
        sign_step_range<TX, TG, TM, false>(x, g, m, begin, end, lr, w1, w2, decay);
    });
  });
}

// ---------------------------------------------------------------------------- variance-normalized update (FAST)

void normuon_update_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& V, const at::Tensor& idx, float beta2,
                     float decay, float neg_lr) {
  constexpr const char* who = "normuon_update_";
  check_matrix(X, who, "X");
  check_matrix(U, who, "U");
  const int64_t m = X.size(0), n = X.size(1), k = U.size(0);
  TORCH_CHECK(U.size(1) == n, who, ": U ", U.sizes(), " must have X's ", n, " columns");
  TORCH_CHECK(V.numel() == m && V.is_contiguous() && V.device().is_cpu(), who, ": V must be a contiguous [", m,
              ", 1] CPU tensor, got ", V.sizes());
  std::vector<int64_t> rows(static_cast<size_t>(k));
  if (idx.defined()) {
    rows = indices_of(idx, m, who);
    TORCH_CHECK(static_cast<int64_t>(rows.size()) == k, who, ": idx has ", rows.size(), " entries for U's ", k,
                " rows");
  } else {
    TORCH_CHECK(k == m, who, ": without idx U must have X's ", m, " rows, got ", k);
    for (int64_t r = 0; r < k; ++r) rows[static_cast<size_t>(r)] = r;
  }
  for (const at::Tensor& t : {X, U, V})
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, who,
                ": tensors must be float32 or bfloat16, got ", t.scalar_type());
  std::vector<float> row_scale(static_cast<size_t>(k));
  with_types(X.scalar_type(), U.scalar_type(), V.scalar_type(), [&](auto tx, auto tu, auto tv) {
    using TX = decltype(tx);
    using TU = decltype(tu);
    using TV = decltype(tv);
    auto* x = ptr<TX>(X);
    const auto* u = ptr<TU>(U);
    auto* v = ptr<TV>(V);
    const float w = 1.0f - beta2;
    double total = 0.0, normed = 0.0;
    for (int64_t r = 0; r < k; ++r) {  // pass 1: row sums, V, the row scales
      const auto* ur = u + r * n;
      // 16 interleaved float partial sums (vectorizable, no serial add chain), then double.
      constexpr int64_t kLanes = 16;
      float part[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= n; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) {
          const float e = TU::load(ur[j + l]);
          part[l] += e * e;
        }
      double sq = 0.0;
      for (; j < n; ++j) sq += static_cast<double>(TU::load(ur[j])) * TU::load(ur[j]);
      for (float p : part) sq += p;
      const size_t p = static_cast<size_t>(rows[static_cast<size_t>(r)]);
      const float mean = static_cast<float>(sq / static_cast<double>(n));
      const float v_new = TV::round(lerp<false>(TV::load(v[p]), mean, w));
      v[p] = TV::store(v_new);
      const double d = static_cast<double>(std::sqrt(v_new)) + 1e-8;
      row_scale[static_cast<size_t>(r)] = static_cast<float>(1.0 / d);
      total += sq;
      normed += sq / (d * d);
    }
    const double f = std::sqrt(total) / std::max(std::sqrt(normed), 1e-8);
    for (float& sc : row_scale) sc = static_cast<float>(sc * f * static_cast<double>(neg_lr));
    if (!idx.defined()) {  // pass 2, U holds every row: X = X decay + U_r scale_r, row by row
      at::parallel_for(0, m, kGrain / std::max<int64_t>(n, 1) + 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          auto* xr = x + r * n;
          const auto* ur = u + r * n;
          const float sc = row_scale[static_cast<size_t>(r)];
          for (int64_t j = 0; j < n; ++j) xr[j] = TX::store(TX::round(TX::load(xr[j]) * decay) + TU::load(ur[j]) * sc);
        }
      });
      return;
    }
    // pass 2, U holds selected rows: X *= decay everywhere, then the update on rows p_r
    at::parallel_for(0, m, kGrain / std::max<int64_t>(n, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        auto* xr = x + r * n;
        for (int64_t j = 0; j < n; ++j) xr[j] = TX::store(TX::load(xr[j]) * decay);
      }
    });
    at::parallel_for(0, k, kGrain / std::max<int64_t>(n, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        auto* xr = x + rows[static_cast<size_t>(r)] * n;
        const auto* ur = u + r * n;
        const float sc = row_scale[static_cast<size_t>(r)];
        for (int64_t j = 0; j < n; ++j) xr[j] = TX::store(TX::load(xr[j]) + TU::load(ur[j]) * sc);
      }
    });
  });
}

}  // namespace dion::math::cpu
