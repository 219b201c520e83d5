// src/train/model/transpose_cpu.cpp — transpose_sum_into (transpose_cpu.h).
//
// Only the functions marked DION_AVX512 are compiled for AVX-512 (cpu_isa.h);
// transpose_sum_kernel_available() checks the CPU before they run.
#include "transpose_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu_isa.h"

namespace dion::train {
namespace {

constexpr int64_t kTile = 16;    // a 16 x 16 fp32 tile: sixteen 512-bit rows
constexpr int64_t kBlock = 256;  // columns of a per block: at N = 128, 128 KiB of output rows

// One full tile: rows a[i * lda + 0..15] + b[...] (i < 16), written as out[j * ldo + 0..15].
DION_AVX512 void tile16(const float* a, const float* b, int64_t lda, float* out, int64_t ldo) {
  __m512 r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_add_ps(_mm512_loadu_ps(a + i * lda), _mm512_loadu_ps(b + i * lda));
  // Pairs of rows interleaved: in 128-bit lane l, t[2k] = (r[2k][4l], r[2k+1][4l], r[2k][4l+1],
  // r[2k+1][4l+1]), t[2k + 1] the same for columns 4l + 2 and 4l + 3.
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // Fours of rows: u[4g + c] holds, in lane l, column 4l + c of rows 4g..4g+3.
  for (int g = 0; g < 4; ++g) {
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  // Lanes gathered across the four groups: output row 4l + c is lane l of u[c], u[4 + c], u[8 + c],
  // u[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);       // lanes 0, 2 of groups 0, 1
    const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);       // lanes 1, 3 of groups 0, 1
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);  // lanes 0, 2 of groups 2, 3
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);  // lanes 1, 3 of groups 2, 3
    _mm512_storeu_ps(out + (c + 0) * ldo, _mm512_shuffle_f32x4(v0, v2, 0x88));
    _mm512_storeu_ps(out + (c + 8) * ldo, _mm512_shuffle_f32x4(v0, v2, 0xDD));
    _mm512_storeu_ps(out + (c + 4) * ldo, _mm512_shuffle_f32x4(v1, v3, 0x88));
    _mm512_storeu_ps(out + (c + 12) * ldo, _mm512_shuffle_f32x4(v1, v3, 0xDD));
  }
}

// A partial tile (at an edge), element by element.
void tile_scalar(const float* a, const float* b, int64_t lda, float* out, int64_t ldo, int64_t tn, int64_t tm) {
  for (int64_t j = 0; j < tm; ++j)
    for (int64_t i = 0; i < tn; ++i) out[j * ldo + i] = a[i * lda + j] + b[i * lda + j];
}

DION_AVX512 void transpose_sum_avx512(const float* pa, const float* pb, float* po, int64_t N, int64_t M) {
  at::parallel_for(0, (M + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t b0 = blk * kBlock, b1 = std::min(M, b0 + kBlock);
      for (int64_t n0 = 0; n0 < N; n0 += kTile) {
        const int64_t tn = std::min(kTile, N - n0);
        for (int64_t m0 = b0; m0 < b1; m0 += kTile) {
          const int64_t tm = std::min(kTile, b1 - m0);
          const float *a = pa + n0 * M + m0, *b = pb + n0 * M + m0;
          float* o = po + m0 * N + n0;
          if (tn == kTile && tm == kTile)
            tile16(a, b, M, o, N);
          else
            tile_scalar(a, b, M, o, N, tn, tm);
        }
      }
    }
  });
}

}  // namespace

bool transpose_sum_kernel_available() { return cpu_avx512_kernels(); }

void transpose_sum_into(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.sizes() == a.sizes() && out.dim() == 2 && out.size(0) == a.size(1) &&
                  out.size(1) == a.size(0),
              "transpose_sum_into: out [M, N], a and b [N, M]; got out ", out.sizes(), ", a ", a.sizes(), ", b ",
              b.sizes());
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu() && out.device().is_cpu() &&
                  a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat &&
                  a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
              "transpose_sum_into: contiguous fp32 CPU tensors; got ", a.scalar_type(), ", ", b.scalar_type(), " into ",
              out.scalar_type());
  if (!transpose_sum_kernel_available()) {
    out.copy_(at::add(a, b).t());
    return;
  }
  transpose_sum_avx512(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.size(0), a.size(1));
}

}  // namespace dion::train
