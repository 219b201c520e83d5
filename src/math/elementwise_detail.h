// src/math/elementwise_detail.h — what the fused element-wise kernels' sources share (private to
// src/math): the element types (F32, and BF16 with c10::BFloat16's rounding), the dtype
// dispatch, ATen's lerp with and without its FMA, sign, the grain size, and the argument checks.
//
// Plain loops the compiler vectorizes (-O3); no intrinsics, no per-file ISA flags, so the
// library runs on any x86-64 (or other) CPU. Element types are tags: F32 (float) and BF16
// (uint16_t storage, c10::BFloat16's bits).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dion::math::cpu::detail {

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
  if (t == at::kFloat)
    f(F32{});
  else
    f(BF16{});
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
// kernels use the platform's FMA; tests/math/test_elementwise.cpp checks whichever runs.)
bool aten_lerp_uses_fma();

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

// ---------------------------------------------------------------------------- checks

// select_dim is -2 (rows) or -1 (columns).
void check_select_dim(int64_t select_dim, const char* who);

// `t` (named `name` in the message) is a contiguous CPU matrix [m, n].
void check_matrix(const at::Tensor& t, const char* who, const char* name);

// idx [k] int64, every entry in [0, size): its entries.
std::vector<int64_t> indices_of(const at::Tensor& idx, int64_t size, const char* who);

// The checks of both selection kernels: A [m, n] float32 / bf16 (named `name`), idx [k] in
// range, U [k, n] or [m, k]; returns idx's entries.
std::vector<int64_t> checked_selection(const at::Tensor& A, const char* name, const at::Tensor& idx,
                                       const at::Tensor& U, int64_t select_dim, const char* who);

}  // namespace dion::math::cpu::detail
