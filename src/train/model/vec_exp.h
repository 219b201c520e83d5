// src/train/model/vec_exp.h — exp of 16 (AVX-512) or 8 (AVX2) fp32 lanes, inline, for the loss
// kernel (cross_entropy_cpu.cpp; private to src/train/model).
//
// exp(x) = 2^n exp(r): n = round(x / ln 2), r = x - n ln 2 with ln 2 in two parts (Cody and
// Waite: n * kLn2Hi is exact for |n| <= 150), so |r| <= ln(2) / 2; exp(r) by its Taylor series to
// r^7 in Horner form with FMAs (the truncation, r^8 / 8! <= 5.2e-9 relative, is a tenth of an
// fp32 ulp); then the scaling by 2^n (AVX-512: scalef; AVX2: two exact powers of two, so that
// results below 2^-126 round once into the subnormals). x is clamped to [-104, 89] first: below,
// exp(x) rounds to 0; above, to inf. NaN stays NaN.
//
// Why not Sleef's expf16_u10 / expf8_u10 (what ATen's vectorized exp calls, and the kernel did):
// the call, and the vector registers the calling convention spills around it, cost as much as
// the math in the loss's exp loop. Measured error (tests/train/model/test_kernels.cpp,
// TrainKernels.VectorExpIsWithinOneUlp; every 97th fp32 value in [-87, 88] against double's exp)
// at most 0.92 ulp, Sleef's 0.95; 99.2% of the values equal Sleef's bits.
#pragma once

#include <immintrin.h>

// GCC 12's AVX-512 intrinsics (the masked forms inside _mm512_roundscale_ps / _mm512_scalef_ps)
// read an undefined vector on purpose; -Wuninitialized reports it where these inline.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dion::train {

inline constexpr float kExpLo = -104.0f, kExpHi = 89.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693145751953125f;      // 12 significant bits
inline constexpr float kLn2Lo = 1.428606765330187e-06f;  // ln 2 - kLn2Hi
// exp(r)'s Taylor coefficients, highest power first (Horner): 1/7!, 1/6!, ..., 1/1!, 1/0!.
inline constexpr float kExpTaylor[] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

__attribute__((target("avx512f,fma"))) inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), _mm512_max_ps(_mm512_set1_ps(kExpLo), x));  // (NaN: the 2nd operand)
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
  return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), x));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
  // 2^n as 2^n1 2^n2, n1 = floor(n / 2), n2 = n - n1, each a normal power of two for n in [-150, 129].
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

}  // namespace dion::train

#pragma GCC diagnostic pop
