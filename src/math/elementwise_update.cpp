// Fused element-wise CPU kernels (see include/dion/math/elementwise.h).
//
// Plain loops the compiler vectorizes (-O3); no intrinsics, no per-file ISA flags, so the
// library runs on any x86-64 (or other) CPU. Element types are tags: F32 (float) and BF16
// (uint16_t storage, c10::BFloat16's bits). Each kernel's comment names the ATen composition
// it reproduces; every intermediate is rounded where that composition stores a result.
#include "dion/math/elementwise.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dion::math::cpu {

namespace {

// ---------------------------------------------------------------------------- element types

struct F32 {
  using storage = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
  static float round(float v) { return v; }
};

struct BF16 {
  using storage = uint16_t;
  static float load(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  // Round to nearest even, NaN to a quiet NaN: c10::BFloat16's conversion.
  static uint16_t store(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return f != f ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(rounded);
  }
  static float round(float v) { return load(store(v)); }
};

template <typename F>
void with_type(at::ScalarType t, F&& f) {
  if (t == at::kFloat) f(F32{});
  else f(BF16{});
}

// with_type over two or three dtypes: f(tag_a, tag_b[, tag_c]).
template <typename F>
void with_types(at::ScalarType a, at::ScalarType b, F&& f) {
  with_type(a, [&](auto ta) { with_type(b, [&](auto tb) { f(ta, tb); }); });
}

template <typename F>
void with_types(at::ScalarType a, at::ScalarType b, at::ScalarType c, F&& f) {
  with_type(a, [&](auto ta) { with_types(b, c, [&](auto tb, auto tc) { f(ta, tb, tc); }); });
}

template <typename T>
typename T::storage* ptr(const at::Tensor& t) {
  return static_cast<typename T::storage*>(t.data_ptr());
}

// Elements per parallel chunk (ATen's grain size: below it, one thread).
constexpr int64_t kGrain = 32768;

// ATen's lerp (aten/src/ATen/native/Lerp.h and cpu/LerpKernel.cpp):
//   |w| < 0.5 ? a + w (b - a) : b - (b - a)(1 - w)
// as one FMA in the vectorized kernels of capability AVX2 / AVX512, as a multiply and an add
// in the DEFAULT capability of x86-64 (no FMA instruction). (Elsewhere ATen's vectorized
// kernels use the platform's FMA; tests/test_elementwise.cpp checks whichever runs.)
bool aten_lerp_uses_fma() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool fma = at::get_cpu_capability() != "DEFAULT";
#else
  static const bool fma = true;
#endif
  return fma;
}

#if defined(__GNUC__)
#define DION_INLINE __attribute__((always_inline)) inline
#else
#define DION_INLINE inline
#endif

template <bool kFma>
DION_INLINE float lerp(float a, float b, float w) {
  const bool small = std::fabs(w) < 0.5f;
  const float coeff = small ? w : w - 1.0f;
  const float base = small ? a : b;
  const float diff = b - a;
  if constexpr (kFma) {
#if defined(__GNUC__)
    return __builtin_fmaf(coeff, diff, base);
#else
    return std::fma(coeff, diff, base);
#endif
  } else {
    return base + coeff * diff;
  }
}

DION_INLINE float sign(float v) { return static_cast<float>((0.0f < v) - (v < 0.0f)); }

void check_select_dim(int64_t select_dim, const char* who) {
  TORCH_CHECK(select_dim == -2 || select_dim == -1, who, ": select_dim must be -2 (rows) or -1 (columns), got ",
              select_dim);
}

void check_matrix(const at::Tensor& t, const char* who, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.device().is_cpu(), who, ": ", name,
              " must be a contiguous CPU matrix [m, n], got ", t.sizes());
}

}  // namespace

// ---------------------------------------------------------------------------- checks

bool fused_kernels_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DION_DISABLE_FUSED");
    return v == nullptr || std::string(v).empty() || std::string(v) == "0";
  }();
  return enabled;
}

bool cpu_fusable(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C) {
  if (!fused_kernels_enabled()) return false;
  auto ok = [&A](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.is_contiguous() && t.numel() == A.numel() &&
           (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  };
  return ok(A) && ok(B) && (!C.defined() || ok(C));
}

// ---------------------------------------------------------------------------- Muon

void momentum_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& U, float mu, bool nesterov) {
  TORCH_CHECK(cpu_fusable(M, G, U), "momentum_: M, G (and U) must be contiguous float32 / bfloat16 CPU tensors of ",
              M.numel(), " elements");
  const int64_t n = M.numel();
  const bool write_u = U.defined();
  const at::ScalarType u_type = write_u ? U.scalar_type() : M.scalar_type();
  with_types(M.scalar_type(), G.scalar_type(), u_type, [&](auto tm, auto tg, auto tu) {
    using TM = decltype(tm);
    using TG = decltype(tg);
    using TU = decltype(tu);
    auto* m = ptr<TM>(M);
    const auto* g_in = ptr<TG>(G);
    auto* u = write_u ? ptr<TU>(U) : nullptr;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      if (write_u && nesterov) {
        for (int64_t i = begin; i < end; ++i) {
          const float g = TM::round(TG::load(g_in[i]));
          const float m_new = TM::round(TM::round(TM::load(m[i]) * mu) + g);
          m[i] = TM::store(m_new);
          u[i] = TU::store(TM::round(TM::round(m_new * mu) + g));
        }
      } else if (write_u) {
        for (int64_t i = begin; i < end; ++i) {
          const float g = TM::round(TG::load(g_in[i]));
          const float m_new = TM::round(TM::round(TM::load(m[i]) * mu) + g);
          m[i] = TM::store(m_new);
          u[i] = TU::store(m_new);
        }
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const float g = TM::round(TG::load(g_in[i]));
          m[i] = TM::store(TM::round(TM::load(m[i]) * mu) + g);
        }
      }
    });
  });
}

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

// ---------------------------------------------------------------------------- Lion

namespace {

template <typename TX, typename TG, typename TM, bool kFma>
DION_INLINE void lion_range(typename TX::storage* x, const typename TG::storage* g_in, typename TM::storage* m,
                            int64_t begin, int64_t end, float lr, float w1, float w2, float decay) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = TM::round(TG::load(g_in[i]));
    const float m_old = TM::load(m[i]);
    const float s = sign(TM::round(lerp<kFma>(m_old, g, w1)));  // U = lerp(M, g, 1 - b1).sign_()
    m[i] = TM::store(lerp<kFma>(m_old, g, w2));                 // M.lerp_(g, 1 - b2)
    const float step = TM::round(s * lr);                      // U.mul_(lr), in M's dtype
    x[i] = TX::store(TX::round(TX::load(x[i]) * decay) - step);
  }
}

// The FMA variant runs only where ATen's own kernels use FMA instructions (capability AVX2 or
// AVX512, whose CPUs have FMA), compiled for them here so that the FMA is one instruction.
template <typename TX, typename TG, typename TM>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64))
__attribute__((target("avx2,fma")))
#endif
void lion_range_fma(typename TX::storage* x, const typename TG::storage* g, typename TM::storage* m, int64_t begin,
                    int64_t end, float lr, float w1, float w2, float decay) {
  lion_range<TX, TG, TM, true>(x, g, m, begin, end, lr, w1, w2, decay);
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
      if (fma) lion_range_fma<TX, TG, TM>(x, g, m, begin, end, lr, w1, w2, decay);
      else lion_range<TX, TG, TM, false>(x, g, m, begin, end, lr, w1, w2, decay);
    });
  });
}

// ---------------------------------------------------------------------------- Dion2

void accumulate_l1_norms_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& norms, int64_t select_dim) {
  constexpr const char* who = "accumulate_l1_norms_";
  check_select_dim(select_dim, who);
  check_matrix(M, who, "M");
  TORCH_CHECK(cpu_fusable(M, G), who, ": G must be a contiguous float32 / bfloat16 CPU tensor like M ", M.sizes());
  const int64_t rows = M.size(0), cols = M.size(1);
  const int64_t n_select = select_dim == -2 ? rows : cols;
  TORCH_CHECK(norms.dim() == 1 && norms.size(0) == n_select && norms.is_contiguous() &&
                  norms.scalar_type() == M.scalar_type(),
              who, ": norms must be a contiguous [", n_select, "] tensor of M's dtype, got ", norms.sizes(), " ",
              norms.scalar_type());
  with_types(M.scalar_type(), G.scalar_type(), [&](auto tm, auto tg) {
    using TM = decltype(tm);
    using TG = decltype(tg);
    auto* m = ptr<TM>(M);
    const auto* g = ptr<TG>(G);
    auto* out = ptr<TM>(norms);
    auto add_row = [&](int64_t r) {
      auto* mr = m + r * cols;
      const auto* gr = g + r * cols;
      for (int64_t j = 0; j < cols; ++j) mr[j] = TM::store(TM::load(mr[j]) + TM::round(TG::load(gr[j])));
    };
    if (select_dim == -2) {
      // Row norms: each a serial float sum along its row (as ATen's reduction); rows in
      // groups of 8 so that 8 independent sums hide the add latency.
      constexpr int64_t kRows = 8;
      at::parallel_for(0, (rows + kRows - 1) / kRows, kGrain / (kRows * cols) + 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kRows, nr = std::min(kRows, rows - r0);
          float acc[kRows] = {};
          for (int64_t r = 0; r < nr; ++r) add_row(r0 + r);
          const auto* base = m + r0 * cols;
          if (nr == kRows) {
            for (int64_t j = 0; j < cols; ++j)
              for (int64_t r = 0; r < kRows; ++r) acc[r] += std::fabs(TM::load(base[r * cols + j]));
          } else {
            for (int64_t r = 0; r < nr; ++r)
              for (int64_t j = 0; j < cols; ++j) acc[r] += std::fabs(TM::load(base[r * cols + j]));
          }
          for (int64_t r = 0; r < nr; ++r) out[r0 + r] = TM::store(acc[r]);
        }
      });
    } else {
      // Column norms: every column's serial sum runs down the rows, all columns at once.
      std::vector<float> acc(static_cast<size_t>(cols), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        add_row(r);
        const auto* mr = m + r * cols;
        for (int64_t j = 0; j < cols; ++j) acc[static_cast<size_t>(j)] += std::fabs(TM::load(mr[j]));
      }
      for (int64_t j = 0; j < cols; ++j) out[j] = TM::store(acc[static_cast<size_t>(j)]);
    }
  });
}

namespace {
// idx [k] int64, every entry in [0, size).
std::vector<int64_t> indices_of(const at::Tensor& idx, int64_t size, const char* who) {
  TORCH_CHECK(idx.dim() == 1 && idx.scalar_type() == at::kLong && idx.device().is_cpu(), who,
              ": idx must be a 1-D int64 CPU tensor, got ", idx.sizes(), " ", idx.scalar_type());
  const at::Tensor c = idx.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  std::vector<int64_t> out(p, p + c.numel());
  for (int64_t i : out) TORCH_CHECK(i >= 0 && i < size, who, ": index ", i, " out of range [0, ", size, ")");
  return out;
}

void check_selected(const at::Tensor& A, const at::Tensor& U, int64_t k, int64_t select_dim, const char* who) {
  const int64_t rows = select_dim == -2 ? k : A.size(0), cols = select_dim == -2 ? A.size(1) : k;
  TORCH_CHECK(U.dim() == 2 && U.size(0) == rows && U.size(1) == cols && U.is_contiguous() && U.device().is_cpu() &&
                  (U.scalar_type() == at::kFloat || U.scalar_type() == at::kBFloat16),
              who, ": U must be a contiguous float32 / bfloat16 CPU matrix [", rows, ", ", cols, "], got ", U.sizes(),
              " ", U.scalar_type());
}
// The checks of both selection kernels: A [m, n] float32 / bf16 (named `name`), idx [k] in
// range, U [k, n] or [m, k]; returns idx's entries.
std::vector<int64_t> checked_selection(const at::Tensor& A, const char* name, const at::Tensor& idx,
                                       const at::Tensor& U, int64_t select_dim, const char* who) {
  check_select_dim(select_dim, who);
  check_matrix(A, who, name);
  TORCH_CHECK(A.scalar_type() == at::kFloat || A.scalar_type() == at::kBFloat16, who, ": ", name,
              " must be float32 or bfloat16, got ", A.scalar_type());
  std::vector<int64_t> sel = indices_of(idx, select_dim == -2 ? A.size(0) : A.size(1), who);
  check_selected(A, U, static_cast<int64_t>(sel.size()), select_dim, who);
  return sel;
}
}  // namespace

void take_selected_(const at::Tensor& M, const at::Tensor& idx, const at::Tensor& U, float ef_decay,
                    int64_t select_dim) {
  const std::vector<int64_t> sel = checked_selection(M, "M", idx, U, select_dim, "take_selected_");
  const int64_t rows = M.size(0), cols = M.size(1), k = static_cast<int64_t>(sel.size());
  with_types(M.scalar_type(), U.scalar_type(), [&](auto tm, auto tu) {
    using TM = decltype(tm);
    using TU = decltype(tu);
    auto* m = ptr<TM>(M);
    auto* u = ptr<TU>(U);
    auto take = [&](typename TM::storage& src, typename TU::storage& dst) {
      const float v = TM::load(src);
      dst = TU::store(v);                    // selected.to(comm dtype)
      src = TM::store(v * ef_decay);         // scatter_(selected * ef_decay)
    };
    if (select_dim == -2) {
      for (int64_t j = 0; j < k; ++j) {
        auto* mr = m + sel[static_cast<size_t>(j)] * cols;
        auto* ur = u + j * cols;
        for (int64_t c = 0; c < cols; ++c) take(mr[c], ur[c]);
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        auto* mr = m + r * cols;
        auto* ur = u + r * k;
        for (int64_t j = 0; j < k; ++j) take(mr[sel[static_cast<size_t>(j)]], ur[j]);
      }
    }
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

// ---------------------------------------------------------------------------- legacy Dion

void add_and_copy_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& out, bool transpose) {
  constexpr const char* who = "add_and_copy_";
  check_matrix(M, who, "M");
  check_matrix(out, who, "out");
  TORCH_CHECK(cpu_fusable(M, G), who, ": G must be a contiguous float32 / bfloat16 CPU tensor like M ", M.sizes());
  const int64_t rows = M.size(0), cols = M.size(1);
  TORCH_CHECK(out.scalar_type() == M.scalar_type() && out.size(0) == (transpose ? cols : rows) &&
                  out.size(1) == (transpose ? rows : cols),
              who, ": out must be M's dtype and shape", transpose ? " transposed" : "", ", got ", out.sizes());
  with_types(M.scalar_type(), G.scalar_type(), [&](auto tm, auto tg) {
    using TM = decltype(tm);
    using TG = decltype(tg);
    auto* m = ptr<TM>(M);
    const auto* g = ptr<TG>(G);
    auto* o = ptr<TM>(out);
    if (!transpose) {
      at::parallel_for(0, rows * cols, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const auto v = TM::store(TM::load(m[i]) + TG::load(g[i]));
          m[i] = v;
          o[i] = v;
        }
      });
      return;
    }
    constexpr int64_t kTile = 16;  // the transposed writes stay within one tile's cache lines
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < cols; ++c)
          m[r * cols + c] = TM::store(TM::load(m[r * cols + c]) + TG::load(g[r * cols + c]));
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t c1 = std::min(cols, c0 + kTile);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) o[c * rows + r] = m[r * cols + c];
      }
    }
  });
}

// ---------------------------------------------------------------------------- NorMuon (FAST)

void normuon_update_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& V, const at::Tensor& idx,
                     float beta2, float decay, float neg_lr) {
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
    if (!idx.defined()) {  // pass 2 (NorMuon): X = X decay + U_r scale_r, row by row
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
    // pass 2 (NorDion2): X *= decay everywhere, then the update on rows p_r
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
