// src/math/bf16_matmul_cpu.cpp — ATen's bf16 matmul loops on CPUs without bf16 GEMMs, vectorized
// (dion/math/bf16_matmul_cpu.h: the three orders, and when each runs).
//
// Every order is a set of runs: each run a sequence of k indices summed one after the other from
// +0, the runs then combined in a fixed order. k is permuted so that each run is contiguous; A is
// packed as float blocks of kMR rows [k][kMR], B as float panels of kNR columns [k][kNR], both in
// that order (zeros past the matrix's edge). The micro-kernel sums one run for a kMR x kNR tile,
// eight outputs a lane (so every output keeps its own sequence of operations), into a buffer;
// the order's combination then runs on the tile's buffers, element by element. The library is
// built with -ffp-contract=off: a multiply and an add stay two roundings where written so.
#include "dion/math/bf16_matmul_cpu.h"
#include "dion/math/ortho.h"

#include "elementwise_detail.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64))
#include <immintrin.h>
#define DION_BF16_LOOP_X86 1
#endif

namespace dion::math::cpu {
namespace {

constexpr int64_t kMR = 4;            // rows of a tile
constexpr int64_t kNR = 16;           // columns of a tile: two AVX2 registers
constexpr int64_t kTile = kMR * kNR;  // outputs of a tile

// ------------------------------------------------------------------------------------ the orders

// k permuted into runs: pos[l] is l's place in the packed order; runs[r] = {start, length}.
// After the runs, `serial` indices (dot64's last tail) are added one by one to the combination.
struct Runs {
  std::vector<int64_t> pos;
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t serial = 0;  // the last `serial` packed indices: added after the combination
};

Runs make_runs(Bf16SumOrder order, int64_t k) {
  Runs r;
  r.pos.resize(static_cast<size_t>(k));
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int64_t> tail;
  if (order == Bf16SumOrder::four_way) {
    const int64_t q = k / 4;
    seqs.resize(4);
    for (int64_t l = 0; l < 4 * q; ++l) seqs[static_cast<size_t>(l % 4)].push_back(l);
    for (int64_t l = 4 * q; l < k; ++l) seqs[0].push_back(l);
  } else if (order == Bf16SumOrder::running) {
    seqs.resize(1);
    for (int64_t l = 0; l < k; ++l) seqs[0].push_back(l);
  } else {  // dot64: 64 lanes over whole blocks of 64, 8 lanes over whole blocks of 16, then serial
    const int64_t aligned = k & ~int64_t{63}, aligned16 = k & ~int64_t{15};
    seqs.resize(64 + 8);
    for (int64_t l = 0; l < aligned; ++l) seqs[static_cast<size_t>(l % 64)].push_back(l);
    for (int64_t l = aligned; l < aligned16; ++l) seqs[static_cast<size_t>(64 + (l - aligned) % 8)].push_back(l);
    for (int64_t l = aligned16; l < k; ++l) tail.push_back(l);
  }
  int64_t at = 0;
  for (const auto& s : seqs) {
    r.runs.emplace_back(at, static_cast<int64_t>(s.size()));
    for (int64_t l : s) r.pos[static_cast<size_t>(l)] = at++;
  }
  for (int64_t l : tail) r.pos[static_cast<size_t>(l)] = at++;
  r.serial = static_cast<int64_t>(tail.size());
  return r;
}

// out[e] = x[e] + y[e] over a tile.
inline void add_tiles(const float* x, const float* y, float* out) {
  for (int64_t e = 0; e < kTile; ++e) out[e] = x[e] + y[e];
}

// The runs' sums of one tile (buf[run][kTile]) combined as the order does, into s[kTile]; buf is
// scratch (dot64 reduces in place).
void combine(Bf16SumOrder order, float* buf, float* s) {
  auto run = [&](int64_t i) { return buf + i * kTile; };
  if (order == Bf16SumOrder::running) {
    std::copy(run(0), run(0) + kTile, s);
    return;
  }
  if (order == Bf16SumOrder::four_way) {  // ((p0 + p1) + p2) + p3
    add_tiles(run(0), run(1), s);
    add_tiles(s, run(2), s);
    add_tiles(s, run(3), s);
    return;
  }
  // dot64: ATen's reduce() of 8 registers x 8 lanes (lane t of register i: run 8 i + t): halving
  // the registers (x[i] + x[i + offset], offset 4, 2, 1), then vec_reduce_all over the lanes
  // (AVX2: v_t = y_t + y_{t+4}; (v_0 + v_2) + (v_1 + v_3)); plus the same lane reduction of the
  // 8-lane tail (runs 64..71).
  for (int64_t offset = 4; offset >= 1; offset /= 2)
    for (int64_t i = 0; i < offset; ++i)
      for (int64_t t = 0; t < 8; ++t) add_tiles(run(8 * i + t), run(8 * (i + offset) + t), run(8 * i + t));
  auto lanes = [&](int64_t first, float* out) {  // runs first .. first + 7 -> out; clobbers them
    for (int64_t t = 0; t < 4; ++t) add_tiles(run(first + t), run(first + t + 4), run(first + t));  // v_t
    add_tiles(run(first + 0), run(first + 2), run(first + 0));                                        // v0 + v2
    add_tiles(run(first + 1), run(first + 3), run(first + 1));                                        // v1 + v3
    add_tiles(run(first + 0), run(first + 1), out);
  };
  lanes(0, s);
  float tail[kTile];
  lanes(64, tail);
  add_tiles(s, tail, s);
}

// ------------------------------------------------------------------------------------ packing

// bf16 bits <-> float as c10::BFloat16 converts (round to nearest even, NaN -> 0x7FC0).
using detail::BF16;

// Rows [i0, i0 + kMR) of a [m, k] (strides sm, sk) as float [k][kMR] in the packed order.
void pack_a(const uint16_t* a, int64_t sm, int64_t sk, int64_t m, int64_t i0, const std::vector<int64_t>& pos,
            float* out) {
  const int64_t k = static_cast<int64_t>(pos.size());
  for (int64_t r = 0; r < kMR; ++r) {
    const int64_t i = i0 + r;
    const uint16_t* row = a + i * sm;
    for (int64_t l = 0; l < k; ++l) out[pos[l] * kMR + r] = i < m ? BF16::load(row[l * sk]) : 0.0f;
  }
}

// Columns [j0, j0 + kNR) of b [k, n] (strides sk, sn) as float [k][kNR] in the packed order.
void pack_b(const uint16_t* b, int64_t sk, int64_t sn, int64_t n, int64_t j0, const std::vector<int64_t>& pos,
            float* out) {
  const int64_t k = static_cast<int64_t>(pos.size());
  const int64_t cols = std::min(kNR, n - j0);
  for (int64_t l = 0; l < k; ++l) {
    const uint16_t* src = b + l * sk + j0 * sn;
    float* dst = out + pos[l] * kNR;
    int64_t c = 0;
    for (; c < cols; ++c) dst[c] = BF16::load(src[c * sn]);
    for (; c < kNR; ++c) dst[c] = 0.0f;
  }
}

// ------------------------------------------------------------------------------------ the kernel

#ifdef DION_BF16_LOOP_X86
// One run of `len` packed indices for a kMR x kNR tile, from +0: out[r * kNR + c] = the sum over
// the run of a[r] * b[c], each step a multiply then an add (kFma false: the scalar loops) or one
// fused multiply-add (kFma true: ATen's Vectorized fmadd).
template <bool kFma>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 step(__m256 acc, __m256 x, __m256 y) {
  if constexpr (kFma)
    return _mm256_fmadd_ps(x, y, acc);
  else
    return _mm256_add_ps(acc, _mm256_mul_ps(x, y));
}

template <bool kFma>
__attribute__((target("avx2,fma"))) void run_tile(const float* A, const float* B, int64_t len, float* out) {
  __m256 p00 = _mm256_setzero_ps(), p01 = _mm256_setzero_ps(), p10 = _mm256_setzero_ps(), p11 = _mm256_setzero_ps(),
         p20 = _mm256_setzero_ps(), p21 = _mm256_setzero_ps(), p30 = _mm256_setzero_ps(), p31 = _mm256_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const __m256 b0 = _mm256_loadu_ps(B + t * kNR);
    const __m256 b1 = _mm256_loadu_ps(B + t * kNR + 8);
    const __m256 a0 = _mm256_broadcast_ss(A + t * kMR + 0);
    const __m256 a1 = _mm256_broadcast_ss(A + t * kMR + 1);
    const __m256 a2 = _mm256_broadcast_ss(A + t * kMR + 2);
    const __m256 a3 = _mm256_broadcast_ss(A + t * kMR + 3);
    p00 = step<kFma>(p00, a0, b0);
    p01 = step<kFma>(p01, a0, b1);
    p10 = step<kFma>(p10, a1, b0);
    p11 = step<kFma>(p11, a1, b1);
    p20 = step<kFma>(p20, a2, b0);
    p21 = step<kFma>(p21, a2, b1);
    p30 = step<kFma>(p30, a3, b0);
    p31 = step<kFma>(p31, a3, b1);
  }
  _mm256_storeu_ps(out + 0 * kNR, p00);
  _mm256_storeu_ps(out + 0 * kNR + 8, p01);
  _mm256_storeu_ps(out + 1 * kNR, p10);
  _mm256_storeu_ps(out + 1 * kNR + 8, p11);
  _mm256_storeu_ps(out + 2 * kNR, p20);
  _mm256_storeu_ps(out + 2 * kNR + 8, p21);
  _mm256_storeu_ps(out + 3 * kNR, p30);
  _mm256_storeu_ps(out + 3 * kNR + 8, p31);
}

// dot64's last indices, added one by one after the combination: s += a * b (a multiply, then an
// add: `reduced_sum += vec1[j] * vec2[j]`).
void serial_tail(const float* A, const float* B, int64_t len, float* s) {
  for (int64_t t = 0; t < len; ++t)
    for (int64_t r = 0; r < kMR; ++r)
      for (int64_t c = 0; c < kNR; ++c) {
        const float prod = A[t * kMR + r] * B[t * kNR + c];
        s[r * kNR + c] = s[r * kNR + c] + prod;
      }
}
#endif

bool cpu_has_avx2_fma() {
#ifdef DION_BF16_LOOP_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

// One matrix: c [m, n] contiguous = a [m, k] b [k, n]. symmetric: b is a^T (the same memory), so
// c[i, j] and c[j, i] are the same products in the same order (each product and each fused
// multiply-add commutes exactly): the tiles wholly below the diagonal are copied across it.
void matmul_one(const uint16_t* a, int64_t sam, int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn, uint16_t* c,
                int64_t m, int64_t k, int64_t n, Bf16SumOrder order, bool symmetric) {
#ifdef DION_BF16_LOOP_X86
  const Runs runs = make_runs(order, k);
  const int64_t nruns = static_cast<int64_t>(runs.runs.size());
  const int64_t row_blocks = (m + kMR - 1) / kMR, col_panels = (n + kNR - 1) / kNR;
  std::vector<float> ap(static_cast<size_t>(row_blocks * k * kMR));
  at::parallel_for(0, row_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ib = begin; ib < end; ++ib) pack_a(a, sam, sak, m, ib * kMR, runs.pos, ap.data() + ib * k * kMR);
  });
  at::parallel_for(0, col_panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> bp(static_cast<size_t>(k * kNR)), buf(static_cast<size_t>(nruns * kTile));
    float s[kTile];
    for (int64_t jp = begin; jp < end; ++jp) {
      const int64_t j0 = jp * kNR, cols = std::min(kNR, n - j0);
      pack_b(b, sbk, sbn, n, j0, runs.pos, bp.data());
      for (int64_t ib = 0; ib < row_blocks; ++ib) {
        if (symmetric && ib * kMR > j0 + kNR - 1) break;  // below the diagonal: mirrored
        const float* A = ap.data() + ib * k * kMR;
        for (int64_t r = 0; r < nruns; ++r) {
          const auto [start, len] = runs.runs[static_cast<size_t>(r)];
          float* out = buf.data() + r * kTile;
          if (order == Bf16SumOrder::dot64)
            run_tile<true>(A + start * kMR, bp.data() + start * kNR, len, out);
          else
            run_tile<false>(A + start * kMR, bp.data() + start * kNR, len, out);
        }
        combine(order, buf.data(), s);
        if (runs.serial > 0) {
          const int64_t start = k - runs.serial;
          serial_tail(A + start * kMR, bp.data() + start * kNR, runs.serial, s);
        }
        const int64_t i0 = ib * kMR, rows = std::min(kMR, m - i0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t cc = 0; cc < cols; ++cc) c[(i0 + r) * n + j0 + cc] = BF16::store(s[r * kNR + cc]);
      }
    }
  });
  if (symmetric) {  // (i, j) was skipped where its row block starts past its panel's last column
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t i0 = i / kMR * kMR;
        for (int64_t j = 0; j < std::min(i, n); ++j)
          if (i0 > j / kNR * kNR + kNR - 1) c[i * n + j] = c[j * n + i];
      }
    });
  }
#else
  (void)a, (void)sam, (void)sak, (void)b, (void)sbk, (void)sbn, (void)c, (void)m, (void)k, (void)n, (void)order,
      (void)symmetric;
#endif
}

// ------------------------------------------------------------------------------------ the probe

bool loop_gemm_enabled_by_env() {
  const char* env = std::getenv("DION_BF16_LOOP_GEMM");
  return !(env && std::string(env) == "0");
}

// The layouts of the probe's operands: which of ATen's loops at::matmul takes.
enum class Layout { row_row, col_col, row_col, col_row };  // a's, then b's

// Operands for the probe: normal values, but the first two products of every output are +2^20
// and -2^20 (a's columns 0 and 1 are 1024 and -1024, b's rows 0 and 1 are 1024). Each order sums
// them and the small products in its own way and loses other low bits, so any other order changes
// most bf16 results (tests/math/test_bf16_matmul.cpp checks that it would).
std::pair<at::Tensor, at::Tensor> probe_operands(int64_t batch, int64_t m, int64_t k, int64_t n, uint64_t seed,
                                                 Layout layout) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor a = at::randn({batch, m, k}, gen, f32), b = at::randn({batch, k, n}, gen, f32);
  a.select(2, 0).fill_(1024.0);
  a.select(2, 1).fill_(-1024.0);
  b.select(1, 0).fill_(1024.0);
  b.select(1, 1).fill_(1024.0);
  a = a.to(at::kBFloat16);
  b = b.to(at::kBFloat16);
  if (layout == Layout::col_col || layout == Layout::col_row) a = a.mT().contiguous().mT();
  if (layout == Layout::col_col || layout == Layout::row_col) b = b.mT().contiguous().mT();
  if (batch == 1) return {a.select(0, 0), b.select(0, 0)};
  return {a, b};
}

bool bitwise_equal(const at::Tensor& x, const at::Tensor& y) {
  return x.sizes() == y.sizes() && at::equal(x.contiguous().view(at::kShort), y.contiguous().view(at::kShort));
}

// One order's probe: 2-D and batched products in each layout that runs it. k = 67 (four-way:
// four runs and a remainder of three; running) and 211 (dot64: three blocks of 64, one of 16,
// three serial).
bool probe_order(Bf16SumOrder order) {
  struct Case {
    int64_t batch, m, k, n;
    Layout layout;
  };
  std::vector<Case> cases;
  if (order == Bf16SumOrder::four_way)
    cases = {{1, 37, 67, 41, Layout::row_row}, {1, 29, 67, 35, Layout::col_col}, {2, 19, 67, 23, Layout::row_row}};
  else if (order == Bf16SumOrder::running)
    cases = {{1, 37, 67, 41, Layout::col_row}, {2, 19, 67, 23, Layout::col_row}};
  else
    cases = {{1, 21, 211, 19, Layout::row_col}, {2, 9, 211, 13, Layout::row_col}};
  for (const Case& c : cases) {
    const auto [a, b] = probe_operands(c.batch, c.m, c.k, c.n, 1000 + static_cast<uint64_t>(c.m), c.layout);
    if (!bitwise_equal(bf16_matmul_in_order(a, b, order), at::matmul(a, b))) return false;
  }
  return true;
}

void check_operands(const at::Tensor& a, const at::Tensor& b) {
  const auto shape = [](const at::Tensor& t) {
    std::string s = "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
    return s + "]";
  };
  const bool dims_ok = (a.dim() == 2 && b.dim() == 2) || (a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0));
  if (!dims_ok || a.size(-1) != b.size(-2))
    throw std::invalid_argument("bf16_matmul_in_order: a " + shape(a) + " and b " + shape(b) +
                                ": expected [m, k] x [k, n] or [B, m, k] x [B, k, n]");
  if (a.scalar_type() != at::kBFloat16 || b.scalar_type() != at::kBFloat16 || !a.device().is_cpu() ||
      !b.device().is_cpu())
    throw std::invalid_argument("bf16_matmul_in_order: a and b must be bfloat16 CPU tensors (a " +
                                std::string(c10::toString(a.scalar_type())) + " on " + a.device().str() + ", b " +
                                std::string(c10::toString(b.scalar_type())) + " on " + b.device().str() + ")");
  if (!cpu_has_avx2_fma()) throw std::invalid_argument("bf16_matmul_in_order: this CPU has no AVX2 and FMA");
}

}  // namespace

std::string to_string(Bf16SumOrder order) {
  return order == Bf16SumOrder::four_way ? "four_way" : order == Bf16SumOrder::running ? "running" : "dot64";
}

at::Tensor bf16_matmul_in_order(const at::Tensor& a, const at::Tensor& b, Bf16SumOrder order) {
  check_operands(a, b);
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1, m = a.size(-2), k = a.size(-1), n = b.size(-1);
  at::Tensor out = at::empty(batched ? std::vector<int64_t>{batch, m, n} : std::vector<int64_t>{m, n},
                             a.options().dtype(at::kBFloat16));
  if (out.numel() == 0) return out;
  if (k == 0) return out.zero_();
  const auto* pa = reinterpret_cast<const uint16_t*>(a.const_data_ptr());
  const auto* pb = reinterpret_cast<const uint16_t*>(b.const_data_ptr());
  auto* pc = reinterpret_cast<uint16_t*>(out.mutable_data_ptr());
  const int64_t sa = batched ? a.stride(0) : 0, sb = batched ? b.stride(0) : 0;
  const bool symmetric = pa == pb && m == n && sa == sb && a.stride(-2) == b.stride(-1) && a.stride(-1) == b.stride(-2);
  for (int64_t i = 0; i < batch; ++i)
    matmul_one(pa + i * sa, a.stride(-2), a.stride(-1), pb + i * sb, b.stride(-2), b.stride(-1), pc + i * m * n, m, k,
               n, order, symmetric);
  return out;
}

bool aten_bf16_order_confirmed(Bf16SumOrder order) {
  // Where ATen may hand the product to oneDNN (by size: a probe of a few shapes cannot tell),
  // never. Asked at each call: torch.backends.mkldnn.enabled can change while the process runs.
  if (aten_bf16_matmul_uses_onednn()) return false;
  static const std::array<bool, 3> confirmed = [] {
    std::array<bool, 3> c{false, false, false};
    if (!cpu_has_avx2_fma() || !loop_gemm_enabled_by_env()) return c;
    for (Bf16SumOrder o : {Bf16SumOrder::four_way, Bf16SumOrder::running, Bf16SumOrder::dot64})
      c[static_cast<size_t>(o)] = probe_order(o);
    return c;
  }();
  return confirmed[static_cast<size_t>(order)];
}

std::optional<Bf16SumOrder> aten_bf16_sum_order(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != at::kBFloat16 || b.scalar_type() != at::kBFloat16 || !a.device().is_cpu() ||
      !b.device().is_cpu())
    return std::nullopt;
  const bool shapes = ((a.dim() == 2 && b.dim() == 2) || (a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0))) &&
                      a.size(-1) == b.size(-2);
  if (!shapes) return std::nullopt;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  // n = 1 and m = 1 take other kernels (a transposed result, a gemv); at::bmm hands products of
  // fewer than 400 multiply-adds a matrix to another loop (baddbmm_cpu_kernel).
  if (m < 2 || n < 2 || k < 1 || m * k * n < 400) return std::nullopt;
  // addmm_impl_cpu_ on a fresh [m, n] result computes c = result^T = b^T a^T column-major: its
  // first operand is our b, "transposed" where b's columns are contiguous over k (and its rows
  // are not), its second our a, "transposed" where a's rows are strided and its columns
  // contiguous; an operand that is neither is copied (not transposed).
  const int64_t sbk = b.stride(-2), sbn = b.stride(-1), sam = a.stride(-2), sak = a.stride(-1);
  const bool first_t = !(sbn == 1 && sbk >= std::max<int64_t>(1, n)) && (sbk == 1 && sbn >= std::max<int64_t>(1, k));
  const bool second_t = !(sak == 1 && sam >= std::max<int64_t>(1, k)) && (sam == 1 && sak >= std::max<int64_t>(1, m));
  const Bf16SumOrder order = first_t == second_t ? Bf16SumOrder::four_way  // gemm_notrans_, gemm_transab_
                             : first_t           ? Bf16SumOrder::dot64      // gemm_transa_
                                                 : Bf16SumOrder::running;   // gemm_transb_
  if (!aten_bf16_order_confirmed(order)) return std::nullopt;
  return order;
}

at::Tensor exact_matmul(const at::Tensor& a, const at::Tensor& b) {
  const std::optional<Bf16SumOrder> order = aten_bf16_sum_order(a, b);
  return order ? bf16_matmul_in_order(a, b, *order) : at::matmul(a, b);
}

}  // namespace dion::math::cpu
