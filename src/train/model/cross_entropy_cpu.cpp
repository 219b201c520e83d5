// src/train/model/cross_entropy_cpu.cpp — the one-pass cross entropy over CPU logits, bf16 or
// fp32 (cross_entropy_cpu.h).
//
// Why a kernel of our own: the loss is otherwise ATen's log-softmax and NLL over the logits (cast
// to fp32 under bf16 autocast) and their backward: about ten passes over [N, V] fp32 tensors (at
// the main job's N = 1024, V = 50304: 206 MB each), most of a step's memory traffic. Here each
// row is read from memory once (its max; the row then sits in the cache), its exp is computed
// once (into the fp32 row itself, or a per-thread fp32 row buffer for bf16), and the gradient is
// written over the logits.
//
// Only the functions marked DION_AVX512 / DION_AVX2 are compiled for those instruction sets (a
// function attribute, so no inline function of a header is emitted with those instructions for
// the rest of the program); cross_entropy_inplace_available() checks the CPU before any of them
// runs.
#include "cross_entropy_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_isa.h"
#include "vec_exp.h"


namespace dion::train {
namespace {

// c10::BFloat16's conversions (round to nearest even, NaN to 0x7FC0) for the scalar element.
inline float to_float(uint16_t b) { return static_cast<float>(c10::BFloat16(b, c10::BFloat16::from_bits())); }
inline float to_float(float f) { return f; }
inline void store_scalar(uint16_t* p, float f) { *p = c10::BFloat16(f).x; }
inline void store_scalar(float* p, float f) { *p = f; }

DION_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 k) {
  const __m256i raw = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
DION_AVX512 inline __m512 load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }

DION_AVX512 inline void store16(uint16_t* p, __m512 f, __mmask16 k) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtepi32_epi16(r));
}
DION_AVX512 inline void store16(float* p, __m512 f, __mmask16 k) { _mm512_mask_storeu_ps(p, k, f); }

// Whether the CPU converts fp32 to bf16 itself (AVX512_BF16: Intel Cooper Lake / Sapphire Rapids
// and later, AMD Zen 4 and later), unless a test asked for the portable conversion.
std::atomic<bool> portable_bf16{false};  // cross_entropy_force_portable_bf16

bool avx512_bf16_ok() {
  static const bool ok = __builtin_cpu_supports("avx512bf16");
  return ok && !portable_bf16.load(std::memory_order_relaxed);
}

// The exp pass of a bf16 row's unscaled gradient on such a CPU: exp(x - m) of each element
// written over it by vcvtneps2bf16 (round to nearest even, as c10's; a subnormal fp32 exp, below
// 1.2e-38, becomes 0 where c10's gives a subnormal bf16), the shifts, adds and NaN blend of the
// portable conversion gone (half the kernel's time on the Xeon in perf samples). Returns the 16
// lanes' sums; `next` as in row_loss16.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma"))) __m512 exp_pass_bf16_native(
    uint16_t* x, int64_t full, __mmask16 tail, __m512 vm, const char* next, const char* next_end) {
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    if (next && next < next_end) {
      _mm_prefetch(next, _MM_HINT_T1);
      next += 64;
    }
    const __m512 ex = exp16(_mm512_sub_ps(load16(x + j, 0xFFFF), vm));
    vsum = _mm512_add_ps(vsum, ex);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + j), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ex)));
  }
  if (tail) {
    const __m512 ex = exp16(_mm512_sub_ps(load16(x + full, tail), vm));
    vsum = _mm512_mask_add_ps(vsum, tail, vsum, ex);
    _mm256_mask_storeu_epi16(x + full, tail, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ex)));
  }
  return vsum;
}

// One row, 16 lanes: returns its loss; with `e` (a V-float buffer: the row itself for fp32),
// writes the gradient over x; with `k_out`, writes the unscaled form instead (cross_entropy_cpu.h)
// and the row's factor into *k_out (fp32: e is x; bf16: e is null where exp_pass_bf16_native
// writes the exps straight to x, else they go from e to x in a second pass). `next` (the
// following row, or null) is prefetched into L2 while this row's exp runs: the next max pass
// reads from L2, not memory.
template <typename T>
DION_AVX512 double row_loss16(T* x, int64_t V, int64_t target, float scale, float* e, float* k_out,
                              const char* next) {
  const char* next_end = next ? next + V * static_cast<int64_t>(sizeof(T)) : nullptr;
  const int64_t full = V / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (V - full)) - 1);
  const float x_target = to_float(x[target]);
  // Four independent maxima (max is exact in any order): the loop is not one chain of vmaxps.
  __m512 vmax = _mm512_set1_ps(-INFINITY), vmax1 = vmax, vmax2 = vmax, vmax3 = vmax;
  int64_t j0 = 0;
  for (; j0 + 64 <= full; j0 += 64) {
    vmax = _mm512_max_ps(vmax, load16(x + j0, 0xFFFF));
    vmax1 = _mm512_max_ps(vmax1, load16(x + j0 + 16, 0xFFFF));
    vmax2 = _mm512_max_ps(vmax2, load16(x + j0 + 32, 0xFFFF));
    vmax3 = _mm512_max_ps(vmax3, load16(x + j0 + 48, 0xFFFF));
  }
  for (; j0 < full; j0 += 16) vmax = _mm512_max_ps(vmax, load16(x + j0, 0xFFFF));
  vmax = _mm512_max_ps(_mm512_max_ps(vmax, vmax1), _mm512_max_ps(vmax2, vmax3));
  if (tail) vmax = _mm512_mask_max_ps(vmax, tail, vmax, load16(x + full, tail));
  const float m = _mm512_reduce_max_ps(vmax);

  const __m512 vm = _mm512_set1_ps(m);
  __m512 vsum = _mm512_setzero_ps();
  bool native = false;  // the bf16 unscaled pass done by exp_pass_bf16_native
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (k_out && !e && avx512_bf16_ok()) {
      vsum = exp_pass_bf16_native(x, full, tail, vm, next, next_end);
      native = true;
    }
  }
  for (int64_t j = 0; j < full && !native; j += 16) {
    if (next && next < next_end) {
      _mm_prefetch(next, _MM_HINT_T1);
      next += 64;
    }
    const __m512 ex = exp16(_mm512_sub_ps(load16(x + j, 0xFFFF), vm));
    vsum = _mm512_add_ps(vsum, ex);
    if (e) _mm512_storeu_ps(e + j, ex);
  }
  if (tail && !native) {
    const __m512 ex = exp16(_mm512_sub_ps(load16(x + full, tail), vm));
    vsum = _mm512_mask_add_ps(vsum, tail, vsum, ex);
    if (e) _mm512_mask_storeu_ps(e + full, tail, ex);
  }
  const float s = _mm512_reduce_add_ps(vsum);
  const float log_p = (x_target - m) - std::log(s);  // log-softmax at the target, as ATen

  if (k_out) {  // exp(x - m) stays; the target's entry gets - s
    *k_out = scale / s;
    if constexpr (std::is_same_v<T, uint16_t>) {  // bf16 without the native pass: e's fp32 exps to x
      if (e) {
        for (int64_t j = 0; j < full; j += 16) store16(x + j, _mm512_loadu_ps(e + j), 0xFFFF);
        if (tail) store16(x + full, _mm512_maskz_loadu_ps(tail, e + full), tail);
      }
    }
    // (bf16's native pass: the target's exp again, the same function on the same value)
    const float e_target = e ? e[target] : _mm512_cvtss_f32(exp16(_mm512_set1_ps(x_target - m)));
    store_scalar(x + target, e_target - s);
  } else if (e) {
    const float k = scale / s;  // softmax * scale = exp(x - m) * (scale / s)
    const float e_target = e[target];
    const __m512 vk = _mm512_set1_ps(k);
    for (int64_t j = 0; j < full; j += 16) store16(x + j, _mm512_mul_ps(_mm512_loadu_ps(e + j), vk), 0xFFFF);
    if (tail) store16(x + full, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, e + full), vk), tail);
    store_scalar(x + target, e_target * k - scale);
  }
  return -static_cast<double>(log_p);
}

DION_AVX2 inline __m256 load_tail8(const float* p, __m256i tail) {
  return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(p, tail), _mm256_castsi256_ps(tail));
}

// The same, 8 lanes of AVX2, fp32 only (the gradient written over x itself). The tail's missing
// lanes read as -inf: they add nothing to the max or (exp(-inf) = 0) to the sum.
DION_AVX2 double row_loss8(float* x, int64_t V, int64_t target, float scale, bool grad, float* k_out,
                           const char* next) {
  const char* next_end = next ? next + V * static_cast<int64_t>(sizeof(float)) : nullptr;
  const int64_t full = V / 8 * 8;
  const int rest = static_cast<int>(V - full);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rest), lane);
  const float x_target = x[target];
  __m256 vmax = _mm256_set1_ps(-INFINITY), vmax1 = vmax, vmax2 = vmax, vmax3 = vmax;
  int64_t j0 = 0;
  for (; j0 + 32 <= full; j0 += 32) {
    vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j0));
    vmax1 = _mm256_max_ps(vmax1, _mm256_loadu_ps(x + j0 + 8));
    vmax2 = _mm256_max_ps(vmax2, _mm256_loadu_ps(x + j0 + 16));
    vmax3 = _mm256_max_ps(vmax3, _mm256_loadu_ps(x + j0 + 24));
  }
  for (; j0 < full; j0 += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j0));
  vmax = _mm256_max_ps(_mm256_max_ps(vmax, vmax1), _mm256_max_ps(vmax2, vmax3));
  if (rest) vmax = _mm256_max_ps(vmax, load_tail8(x + full, tail));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = lanes[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, lanes[i]);

  const __m256 vm = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 8) {
    if (next && next < next_end && (j & 8) == 0) {  // a 64-byte line every other iteration
      _mm_prefetch(next, _MM_HINT_T1);
      next += 64;
    }
    const __m256 ex = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
    vsum = _mm256_add_ps(vsum, ex);
    if (grad) _mm256_storeu_ps(x + j, ex);
  }
  if (rest) {
    const __m256 ex = exp8(_mm256_sub_ps(load_tail8(x + full, tail), vm));
    vsum = _mm256_add_ps(vsum, ex);
    if (grad) _mm256_maskstore_ps(x + full, tail, ex);
  }
  _mm256_store_ps(lanes, vsum);
  float s = 0;
  for (float l : lanes) s += l;
  const float log_p = (x_target - m) - std::log(s);

  if (grad && k_out) {
    *k_out = scale / s;
    x[target] -= s;
  } else if (grad) {
    const float k = scale / s;
    const float e_target = x[target];
    const __m256 vk = _mm256_set1_ps(k);
    for (int64_t j = 0; j < full; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), vk));
    if (rest) _mm256_maskstore_ps(x + full, tail, _mm256_mul_ps(_mm256_maskload_ps(x + full, tail), vk));
    x[target] = e_target * k - scale;
  }
  return -static_cast<double>(log_p);
}

}  // namespace

void cross_entropy_force_portable_bf16(bool on) { portable_bf16.store(on, std::memory_order_relaxed); }

bool cross_entropy_inplace_available(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return cpu_avx512_kernels();
  if (dtype == at::kFloat) return cpu_avx512_kernels() || cpu_avx2_kernels();
  return false;
}

double cross_entropy_inplace(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index, float scale,
                             bool grad, at::Tensor* row_factor) {
  const at::ScalarType dtype = logits.scalar_type();
  TORCH_CHECK(logits.dim() == 2 && (dtype == at::kBFloat16 || dtype == at::kFloat) && logits.is_contiguous() &&
                  logits.device().is_cpu(),
              "cross_entropy_inplace: logits must be a contiguous CPU bf16 or fp32 [N, V]; got ", logits.sizes(), " ",
              dtype, " on ", logits.device());
  TORCH_CHECK(cross_entropy_inplace_available(dtype), "cross_entropy_inplace: this CPU has no kernel for ", dtype,
              " logits (bf16: AVX-512 F/BW/VL; fp32: AVX-512 or AVX2 with FMA)");
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(
      targets.dim() == 1 && targets.size(0) == N && targets.scalar_type() == at::kLong && targets.device().is_cpu(),
      "cross_entropy_inplace: targets must be CPU int64 [", N, "]; got ", targets.sizes(), " ", targets.scalar_type());
  TORCH_CHECK(!row_factor || grad, "cross_entropy_inplace: the unscaled gradient (row_factor) needs grad");
  float* kp = nullptr;
  if (row_factor) {
    *row_factor = at::empty({N}, logits.options().dtype(at::kFloat));
    kp = row_factor->mutable_data_ptr<float>();
  }
  const at::Tensor t = targets.contiguous();
  const int64_t* tp = t.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    TORCH_CHECK(tp[r] == ignore_index || (tp[r] >= 0 && tp[r] < V), "cross entropy: target ", tp[r], " of row ", r,
                " is out of bounds (the vocabulary has ", V, " entries)");
  const bool bf16 = dtype == at::kBFloat16, wide = cpu_avx512_kernels();
  const size_t row_bytes = static_cast<size_t>(V) * (bf16 ? sizeof(uint16_t) : sizeof(float));
  auto* base = static_cast<char*>(logits.mutable_data_ptr());
  std::vector<double> losses(static_cast<size_t>(N), 0.0);
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    // bf16's fp32 exp row (not for the native unscaled pass)
    const bool native_bf16 = bf16 && kp && avx512_bf16_ok();
    std::vector<float> e(grad && bf16 && !native_bf16 ? static_cast<size_t>(V) : 0);
    for (int64_t r = begin; r < end; ++r) {
      void* row = base + static_cast<size_t>(r) * row_bytes;
      float* k = kp ? kp + r : nullptr;
      if (tp[r] == ignore_index) {
        if (grad) std::memset(row, 0, row_bytes);
        if (k) *k = 0.0f;
        continue;
      }
      double& loss = losses[static_cast<size_t>(r)];
      const char* next = r + 1 < end ? static_cast<const char*>(row) + row_bytes : nullptr;
      if (bf16) {
        loss = row_loss16(static_cast<uint16_t*>(row), V, tp[r], scale, e.empty() ? nullptr : e.data(), k, next);
      } else if (wide) {
        auto* x = static_cast<float*>(row);
        loss = row_loss16(x, V, tp[r], scale, grad ? x : nullptr, k, next);
      } else {
        loss = row_loss8(static_cast<float*>(row), V, tp[r], scale, grad, k, next);
      }
    }
  });
  double sum = 0;
  for (double l : losses) sum += l;  // row order: the same for any thread count
  return sum;
}

}  // namespace dion::train
