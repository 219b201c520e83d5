// src/train/model/cross_entropy_bf16.cpp — the one-pass cross entropy over bf16 logits
// (cross_entropy_bf16.h).
//
// Why a kernel of our own: under bf16 autocast the loss is ATen's log-softmax and NLL over the
// logits cast to fp32, and their backward: about ten passes over [N, V] fp32 tensors (at the
// main job's N = 1024, V = 50304: 206 MB each), most of a bf16 step's memory traffic. Here each
// row is read from memory once (its max; the row then sits in the cache), its exp is computed
// once into a per-thread fp32 row buffer, and the gradient is written over the bf16 logits.
//
// Only the functions marked DION_AVX512 are compiled for AVX-512 (a function attribute, so no
// inline function of a header is emitted with those instructions for the rest of the program);
// cross_entropy_bf16_available() checks the CPU before any of them runs.
#include "cross_entropy_bf16.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

// Sleef's 16-lane expf, 1.0 ULP (the one ATen's Vectorized<float>::exp calls; LibTorch exports it).
extern "C" __m512 Sleef_expf16_u10(__m512);

#define DION_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

namespace dion::train {
namespace {

// c10::BFloat16's conversions (round to nearest even, NaN to 0x7FC0) for the scalar element.
inline float bf16_to_float(uint16_t b) { return static_cast<float>(c10::BFloat16(b, c10::BFloat16::from_bits())); }
inline uint16_t float_to_bf16(float f) { return c10::BFloat16(f).x; }

DION_AVX512 inline __m512 load_bf16(const uint16_t* p, __mmask16 k) {
  const __m256i raw = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

DION_AVX512 inline void store_bf16(uint16_t* p, __m512 f, __mmask16 k) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtepi32_epi16(r));
}

// One row: returns its loss; with `e` (a V-float buffer), writes the gradient over x.
DION_AVX512 double row_loss(uint16_t* x, int64_t V, int64_t target, float scale, float* e) {
  const int64_t full = V / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (V - full)) - 1);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < full; j += 16) vmax = _mm512_max_ps(vmax, load_bf16(x + j, 0xFFFF));
  if (tail) vmax = _mm512_mask_max_ps(vmax, tail, vmax, load_bf16(x + full, tail));
  const float m = _mm512_reduce_max_ps(vmax);

  const __m512 vm = _mm512_set1_ps(m);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 ex = Sleef_expf16_u10(_mm512_sub_ps(load_bf16(x + j, 0xFFFF), vm));
    vsum = _mm512_add_ps(vsum, ex);
    if (e) _mm512_storeu_ps(e + j, ex);
  }
  if (tail) {
    const __m512 ex = Sleef_expf16_u10(_mm512_sub_ps(load_bf16(x + full, tail), vm));
    vsum = _mm512_mask_add_ps(vsum, tail, vsum, ex);
    if (e) _mm512_mask_storeu_ps(e + full, tail, ex);
  }
  const float s = _mm512_reduce_add_ps(vsum);
  const float log_p = (bf16_to_float(x[target]) - m) - std::log(s);  // log-softmax at the target, as ATen

  if (e) {
    const float k = scale / s;  // softmax * scale = exp(x - m) * (scale / s)
    const __m512 vk = _mm512_set1_ps(k);
    for (int64_t j = 0; j < full; j += 16) store_bf16(x + j, _mm512_mul_ps(_mm512_loadu_ps(e + j), vk), 0xFFFF);
    if (tail) store_bf16(x + full, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, e + full), vk), tail);
    x[target] = float_to_bf16(e[target] * k - scale);
  }
  return -static_cast<double>(log_p);
}

}  // namespace

bool cross_entropy_bf16_available() {
  // The CPU's flags, and ATen's own capability: ATEN_CPU_CAPABILITY=avx2 (scripts/test_avx2.sh)
  // makes an AVX-512 CPU an AVX2-only one for ATen's kernels, and for this one too.
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && at::get_cpu_capability() == "AVX512";
  return ok;
}

double cross_entropy_bf16_inplace(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index, float scale,
                                  bool grad) {
  TORCH_CHECK(cross_entropy_bf16_available(), "cross_entropy_bf16_inplace: this CPU has no AVX-512 F/BW/VL");
  TORCH_CHECK(
      logits.dim() == 2 && logits.scalar_type() == at::kBFloat16 && logits.is_contiguous() && logits.device().is_cpu(),
      "cross_entropy_bf16_inplace: logits must be a contiguous CPU bf16 [N, V]; got ", logits.sizes(), " ",
      logits.scalar_type(), " on ", logits.device());
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(
      targets.dim() == 1 && targets.size(0) == N && targets.scalar_type() == at::kLong && targets.device().is_cpu(),
      "cross_entropy_bf16_inplace: targets must be CPU int64 [", N, "]; got ", targets.sizes(), " ",
      targets.scalar_type());
  const at::Tensor t = targets.contiguous();
  const int64_t* tp = t.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    TORCH_CHECK(tp[r] == ignore_index || (tp[r] >= 0 && tp[r] < V), "cross entropy: target ", tp[r], " of row ", r,
                " is out of bounds (the vocabulary has ", V, " entries)");
  auto* x = reinterpret_cast<uint16_t*>(logits.mutable_data_ptr());
  std::vector<double> losses(static_cast<size_t>(N), 0.0);
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(grad ? static_cast<size_t>(V) : 0);
    for (int64_t r = begin; r < end; ++r) {
      uint16_t* row = x + r * V;
      if (tp[r] == ignore_index) {
        if (grad) std::memset(row, 0, static_cast<size_t>(V) * sizeof(uint16_t));
        continue;
      }
      losses[static_cast<size_t>(r)] = row_loss(row, V, tp[r], scale, grad ? e.data() : nullptr);
    }
  });
  double sum = 0;
  for (double l : losses) sum += l;  // row order: the same for any thread count
  return sum;
}

}  // namespace dion::train
