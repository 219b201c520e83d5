// The exact path's bf16 products (dion/math/bf16_matmul_cpu.h): each of ATen's three loop orders
// against a scalar transcription of it (on every CPU), and against at::matmul bit for bit wherever
// the probes say ATen sums in it: every layout, batched and not, k of every residue mod 4 and 16
// and around 64, tile edges, zeros of both signs, infinities, NaN, products below float's normal
// range. Another order must fail the probe's operands (the probe can fail), and the
// orthogonalizers through the kernel must equal them through ATen.
//
// ctest runs this binary twice: as the machine is (on a CPU with oneDNN's bf16 GEMMs ATen takes
// them, the probes fail and exact_matmul is at::matmul) and with oneDNN capped at AVX2
// (bf16_loop.*: ATen runs its loops on every CPU and the four_way probe must pass, the running
// and dot64 ones too where ATen's kernels are AVX2's, so the kernel is compared with ATen on the
// CI's CPU whatever it is).
#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "dion/math/bf16_matmul_cpu.h"
#include "dion/math/ortho.h"
// The coefficient tables (private to src/math): the compositions below must use the same.
#include "../../src/math/ortho_coeffs.h"

namespace {

namespace cpu = dion::math::cpu;

#if defined(__x86_64__) || defined(_M_X64)
#define CPU_HAS(feature) __builtin_cpu_supports(feature)
#else
#define CPU_HAS(feature) false
#endif
bool cpu_has_avx2() { return CPU_HAS("avx2") && CPU_HAS("fma"); }

uint16_t to_bf16_bits(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The three orders written out one output at a time; volatile keeps every product and sum a
// separate float operation (no contraction, no reassociation); dot64's steps are fused
// multiply-adds (std::fma in float: one rounding), as ATen's Vectorized fmadd.
float sum_in_order(cpu::Bf16SumOrder order, const float* x, const float* y, int64_t k) {
  using O = cpu::Bf16SumOrder;
  if (order == O::running) {
    volatile float s = 0.0f;
    for (int64_t l = 0; l < k; ++l) {
      volatile float prod = x[l] * y[l];
      s = s + prod;
    }
    return s;
  }
  if (order == O::four_way) {
    volatile float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int64_t q = k / 4;
    for (int64_t l = 0; l < k; ++l) {
      volatile float prod = x[l] * y[l];
      const int64_t r = l < 4 * q ? l % 4 : 0;
      p[r] = p[r] + prod;
    }
    volatile float s = p[0] + p[1];
    s = s + p[2];
    return s + p[3];
  }
  // dot64: sum[8][8] over whole blocks of 64 (register i lane t: l % 64 == 8 i + t), halved
  // (offset 4, 2, 1), lanes reduced as (y0+y4 + y2+y6) + (y1+y5 + y3+y7); a tail of 8 lanes over
  // whole blocks of 16 (lane t: l % 8 == t), reduced alike and added; the rest added one by one.
  float sum[8][8] = {}, tail[8] = {};
  const int64_t aligned = k & ~int64_t{63}, aligned16 = k & ~int64_t{15};
  for (int64_t l = 0; l < aligned; ++l) sum[(l % 64) / 8][l % 8] = std::fma(x[l], y[l], sum[(l % 64) / 8][l % 8]);
  for (int64_t l = aligned; l < aligned16; ++l) tail[(l - aligned) % 8] = std::fma(x[l], y[l], tail[(l - aligned) % 8]);
  for (int offset = 4; offset >= 1; offset /= 2)
    for (int i = 0; i < offset; ++i)
      for (int t = 0; t < 8; ++t) sum[i][t] = sum[i][t] + sum[i + offset][t];
  auto lanes = [](const float* v) {
    volatile float v0 = v[0] + v[4], v1 = v[1] + v[5], v2 = v[2] + v[6], v3 = v[3] + v[7];
    volatile float a = v0 + v2, b = v1 + v3;
    return a + b;
  };
  volatile float s = lanes(sum[0]);
  s = s + lanes(tail);
  for (int64_t l = aligned16; l < k; ++l) {
    volatile float prod = x[l] * y[l];
    s = s + prod;
  }
  return s;
}

at::Tensor order_reference(const at::Tensor& a, const at::Tensor& b, cpu::Bf16SumOrder order) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const at::Tensor af = a.to(at::kFloat).contiguous(), bt = b.to(at::kFloat).t().contiguous();
  at::Tensor out = at::empty({m, n}, at::kShort);
  int16_t* po = out.data_ptr<int16_t>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      po[i * n + j] =
          static_cast<int16_t>(to_bf16_bits(sum_in_order(order, af.data_ptr<float>() + i * k, bt.data_ptr<float>() + j * k, k)));
  return out.view(at::kBFloat16);
}

const cpu::Bf16SumOrder kOrders[] = {cpu::Bf16SumOrder::four_way, cpu::Bf16SumOrder::running,
                                     cpu::Bf16SumOrder::dot64};

// Another order (a sum in double): what the probe's operands must tell apart.
at::Tensor double_sum_reference(const at::Tensor& a, const at::Tensor& b) {
  return at::matmul(a.to(at::kDouble), b.to(at::kDouble)).to(at::kFloat).to(at::kBFloat16);
}

::testing::AssertionResult bit_identical(const at::Tensor& x, const at::Tensor& y) {
  if (x.sizes() != y.sizes()) return ::testing::AssertionFailure() << "shapes " << x.sizes() << " vs " << y.sizes();
  const at::Tensor bx = x.contiguous().view(at::kShort), by = y.contiguous().view(at::kShort);
  const int64_t differ = bx.ne(by).sum().item<int64_t>();
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << x.numel() << " outputs differ in their bits";
}

// Normal values, but the first two products of every output are +2^20 and -2^20 (the probe's
// design: the order decides which small products lose their low bits).
std::pair<at::Tensor, at::Tensor> cancelling(int64_t batch, int64_t m, int64_t k, int64_t n) {
  std::vector<int64_t> sa = {m, k}, sb = {k, n};
  if (batch > 0) {
    sa.insert(sa.begin(), batch);
    sb.insert(sb.begin(), batch);
  }
  at::Tensor a = at::randn(sa), b = at::randn(sb);
  if (k >= 2) {
    a.select(-1, 0).fill_(1024.0);
    a.select(-1, 1).fill_(-1024.0);
    b.select(-2, 0).fill_(1024.0);
    b.select(-2, 1).fill_(1024.0);
  }
  return {a.to(at::kBFloat16), b.to(at::kBFloat16)};
}

// The same values in other layouts: 0 row-major, 1 column-major, 2 rows of a wider buffer,
// 3 columns of a taller one, 4 every other column of a wider buffer.
at::Tensor in_layout(const at::Tensor& t, int kind) {
  const int64_t r = t.size(-2), c = t.size(-1);
  auto buffer = [&](int64_t rows, int64_t cols) {
    std::vector<int64_t> s = {rows, cols};
    if (t.dim() == 3) s.insert(s.begin(), t.size(0));
    return at::zeros(s, t.options());
  };
  switch (kind) {
    case 0: return t.contiguous();
    case 1: return t.mT().contiguous().mT();
    case 2: return buffer(r, c + 5).narrow(-1, 0, c).copy_(t);
    case 3: return buffer(c, r + 3).narrow(-1, 0, r).mT().copy_(t);
    default: return buffer(r, 2 * c).slice(-1, 0, 2 * c, 2).copy_(t);
  }
}

// oneDNN capped at AVX2 has no bf16 GEMM (it needs AVX-512 or AVX-NE-CONVERT): ATen runs its loops.
bool onednn_capped_at_avx2() {
  const char* env = std::getenv("ONEDNN_MAX_CPU_ISA");
  return env && std::string(env) == "AVX2";
}

// ATen's kernels are AVX2's (8-lane Vectorized<float>): the CPU has no AVX-512 and no override.
bool aten_kernels_avx2() {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  if (cap && std::string(cap) == "default") return false;
  return !CPU_HAS("avx512f") || (cap && std::string(cap) == "avx2");
}

TEST(Bf16LoopMatmul, EachOrderEqualsItWrittenOut) {
  if (!cpu_has_avx2()) {
    const auto [a, b] = cancelling(0, 4, 8, 4);
    EXPECT_THROW(cpu::bf16_matmul_in_order(a, b, cpu::Bf16SumOrder::four_way), std::invalid_argument);
    return;
  }
  at::manual_seed(3);
  // k of every residue mod 4 and 16, below 4, around 64 and 128; rows and columns around the
  // 4 x 16 tile.
  for (int64_t m : {1, 3, 5, 9})
    for (int64_t k : {1, 2, 3, 5, 7, 16, 17, 63, 64, 67, 80, 95, 130, 211})
      for (int64_t n : {1, 16, 17, 33}) {
        const auto [a, b] = cancelling(0, m, k, n);
        for (cpu::Bf16SumOrder order : kOrders) {
          const at::Tensor expected = order_reference(a, b, order);
          for (int la : {0, 1, 4})
            for (int lb : {0, 1, 3}) {
              const at::Tensor A = in_layout(a, la), B = in_layout(b, lb);
              EXPECT_TRUE(bit_identical(cpu::bf16_matmul_in_order(A, B, order), expected))
                  << cpu::to_string(order) << ": [" << m << ", " << k << "] x [" << k << ", " << n << "], layouts "
                  << la << ", " << lb;
            }
        }
      }
}

TEST(Bf16LoopMatmul, SpecialValuesFollowEachOrder) {
  ASSERT_TRUE(cpu_has_avx2()) << "every CPU the project runs on has AVX2";
  at::manual_seed(4);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t k = 83;  // dot64: one block of 64, one of 16, three one by one
  at::Tensor a = at::randn({7, k}), b = at::randn({k, 18});
  a[0][0] = inf;      // row 0: +inf in the products of l = 0
  a[1][70] = nan;     // row 1: NaN (in dot64's tail)
  a[2].zero_();       // row 2: +0 products, and -0 in column 3
  b.select(1, 3).fill_(-0.0);
  a[3].fill_(1e-30f);  // row 3: products below float's normal range (1e-30 * 1e-15)
  b[4].fill_(1e-15f);
  b[81].fill_(1e-15f);
  a[4][1] = 3e38f;  // row 4: a product that overflows float
  b[1][5] = 3e38f;
  a[5][0] = -inf;  // row 5: -inf, and +inf from row 0's column: NaN where both meet
  a[5][64] = inf;
  const at::Tensor A = a.to(at::kBFloat16), B = b.to(at::kBFloat16);
  for (cpu::Bf16SumOrder order : kOrders) {
    const at::Tensor ours = cpu::bf16_matmul_in_order(A, B, order);
    EXPECT_TRUE(bit_identical(ours, order_reference(A, B, order))) << cpu::to_string(order);
    // A NaN output is c10's canonical bf16 NaN, as ATen stores it.
    EXPECT_EQ(ours.view(at::kShort)[1][0].item<int16_t>(), 0x7FC0) << cpu::to_string(order);
  }
  // Through at::matmul's own layouts where ATen runs the loops.
  const at::Tensor Acol = A.t().contiguous().t(), Bcol = B.t().contiguous().t();
  for (const auto& [x, y] : {std::pair{A, B}, std::pair{Acol, Bcol}, std::pair{A, Bcol}, std::pair{Acol, B}}) {
    const std::optional<cpu::Bf16SumOrder> order = cpu::aten_bf16_sum_order(x, y);
    if (order) {
      EXPECT_TRUE(bit_identical(cpu::bf16_matmul_in_order(x, y, *order), at::matmul(x, y))) << cpu::to_string(*order);
    }
    EXPECT_TRUE(bit_identical(cpu::exact_matmul(x, y), at::matmul(x, y)));
  }
}

TEST(Bf16LoopMatmul, EqualsAtenWhereAtenRunsTheLoops) {
  if (onednn_capped_at_avx2()) {
    EXPECT_TRUE(cpu::aten_bf16_order_confirmed(cpu::Bf16SumOrder::four_way))
        << "with oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA) ATen must run its bf16 loops, and the probe found "
           "at::matmul of two row-major operands summing in another order than gemm_notrans_'s";
    // gemm_transb_'s running sum and gemm_transa_'s dot product were read off ATen's AVX2 kernels
    // (a Zen 3); under AVX-512's the probe decides, and the comparisons below hold either way.
    if (aten_kernels_avx2()) {
      EXPECT_TRUE(cpu::aten_bf16_order_confirmed(cpu::Bf16SumOrder::running)) << "gemm_transb_'s running sum";
      EXPECT_TRUE(cpu::aten_bf16_order_confirmed(cpu::Bf16SumOrder::dot64)) << "gemm_transa_'s AVX2 dot product";
    }
  }
  at::manual_seed(5);
  int64_t taken[3] = {0, 0, 0}, compared = 0;
  for (int64_t batch : {0, 1, 3})
    for (int64_t m : {1, 2, 5, 16, 33})
      for (int64_t k : {1, 2, 5, 31, 67, 150})
        for (int64_t n : {1, 2, 15, 40}) {
          const auto [a, b] = cancelling(batch, m, k, n);
          for (int la = 0; la < 5; ++la)
            for (int lb = 0; lb < 5; ++lb) {
              const at::Tensor A = in_layout(a, la), B = in_layout(b, lb);
              const at::Tensor expected = at::matmul(A, B);
              ++compared;
              const std::string what = "batch " + std::to_string(batch) + ", [" + std::to_string(m) + ", " +
                                       std::to_string(k) + "] x [" + std::to_string(k) + ", " + std::to_string(n) +
                                       "], layouts " + std::to_string(la) + ", " + std::to_string(lb);
              EXPECT_TRUE(bit_identical(cpu::exact_matmul(A, B), expected)) << "exact_matmul: " << what;
              const std::optional<cpu::Bf16SumOrder> order = cpu::aten_bf16_sum_order(A, B);
              if (!order) continue;
              ++taken[static_cast<int>(*order)];
              EXPECT_TRUE(bit_identical(cpu::bf16_matmul_in_order(A, B, *order), expected))
                  << cpu::to_string(*order) << ": " << what;
            }
        }
  for (cpu::Bf16SumOrder order : kOrders) {
    const int64_t t = taken[static_cast<int>(order)];
    std::cout << "[ order    ] " << cpu::to_string(order) << ": "
              << (cpu::aten_bf16_order_confirmed(order) ? "ATen sums in it here" : "not ATen's here") << ", took " << t
              << " of " << compared << " products\n";
    if (cpu::aten_bf16_order_confirmed(order))
      EXPECT_GT(t, compared / 20) << cpu::to_string(order) << " took " << t << " of " << compared << " products";
    else
      EXPECT_EQ(t, 0) << cpu::to_string(order) << ": where its probe fails, exact_matmul must be ATen's call";
  }
}

// Where ATen may hand bf16 products to oneDNN (an AVX-512 CPU without a cap below AVX512_CORE)
// it does so by size, so no order may be confirmed: on an AMD Zen 5 the running order's probe
// passed while batched products of 3 x 33 x 150 x 40 went to oneDNN and differed (2026-12-07).
// The product below is one of those; it must be ATen's call here, bit for bit.
TEST(Bf16LoopMatmul, NoOrderWhereAtenMayHandBf16ToOneDnn) {
  const bool avx512_core = CPU_HAS("avx512f") && CPU_HAS("avx512bw") && CPU_HAS("avx512vl") && CPU_HAS("avx512dq");
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  const bool capped_below = cap && (std::string(cap) == "AVX2" || std::string(cap) == "AVX2_VNNI");
  if (avx512_core && !capped_below) {
    EXPECT_TRUE(dion::math::aten_bf16_matmul_uses_onednn());
  }
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto ne = caps.find("avx_ne_convert");
  const bool ne_convert = ne != caps.end() && ne->second.isBool() && ne->second.toBool();
  if ((!CPU_HAS("avx512f") || capped_below) && !ne_convert) {
    EXPECT_FALSE(dion::math::aten_bf16_matmul_uses_onednn());
  }
  if (!dion::math::aten_bf16_matmul_uses_onednn()) return;
  for (cpu::Bf16SumOrder order : kOrders) EXPECT_FALSE(cpu::aten_bf16_order_confirmed(order)) << cpu::to_string(order);
  at::manual_seed(12);
  const auto [a, b] = cancelling(3, 33, 150, 40);
  const at::Tensor acol = a.mT().contiguous().mT();  // column-major a, row-major b: gemm_transb_'s layout
  EXPECT_FALSE(cpu::aten_bf16_sum_order(acol, b).has_value());
  EXPECT_TRUE(bit_identical(cpu::exact_matmul(acol, b), at::matmul(acol, b)));
}

// X X^T and X^T X on the same memory: the kernel computes the tiles on and above the diagonal
// and mirrors the rest; the mirror must equal computing every output (and ATen).
TEST(Bf16LoopMatmul, SymmetricProductsMirrorExactly) {
  ASSERT_TRUE(cpu_has_avx2());
  at::manual_seed(8);
  for (int64_t batch : {0, 2})
    for (int64_t m : {2, 5, 17, 37, 70})
      for (int64_t k : {9, 67, 211}) {
        auto [x, unused] = cancelling(batch, m, k, 1);
        (void)unused;
        const at::Tensor copy = x.clone();
        for (const bool gram_left : {true, false}) {  // X X^T (dot64), X^T X (running)
          const at::Tensor a = gram_left ? x : x.mT(), b = gram_left ? x.mT() : x;
          const at::Tensor a2 = gram_left ? copy : copy.mT(), b2 = gram_left ? x.mT() : x;  // not aliased
          for (cpu::Bf16SumOrder order : kOrders) {
            EXPECT_TRUE(bit_identical(cpu::bf16_matmul_in_order(a, b, order), cpu::bf16_matmul_in_order(a2, b2, order)))
                << cpu::to_string(order) << (gram_left ? " X X^T" : " X^T X") << ", batch " << batch << ", X [" << m
                << ", " << k << "]";
          }
          EXPECT_TRUE(bit_identical(cpu::exact_matmul(a, b), at::matmul(a, b)))
              << (gram_left ? "X X^T" : "X^T X") << ", batch " << batch << ", X [" << m << ", " << k << "]";
        }
      }
}

// A lane-wise sum (l mod `lanes`, fused multiply-adds, lanes added in turn): how a wider vector
// kernel (ATen's dot under AVX-512's 16 lanes) or a GEMM's k-blocking splits a sum.
at::Tensor lane_sum_reference(const at::Tensor& a, const at::Tensor& b, int64_t lanes) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const at::Tensor af = a.to(at::kFloat).contiguous(), bt = b.to(at::kFloat).t().contiguous();
  at::Tensor out = at::empty({m, n}, at::kFloat);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> p(static_cast<size_t>(lanes), 0.0f);
      for (int64_t l = 0; l < k; ++l)
        p[static_cast<size_t>(l % lanes)] =
            std::fma(af[i][l].item<float>(), bt[j][l].item<float>(), p[static_cast<size_t>(l % lanes)]);
      volatile float s = 0.0f;
      for (float v : p) s = s + v;
      out[i][j] = static_cast<float>(s);
    }
  return out.to(at::kBFloat16);
}

// On the probe's operands every order the kernel reproduces differs from the others and from
// other plausible orders in most outputs, so a probe passes only where ATen sums in the order it
// tests. (The running sum cancels the two large products first and sums the small ones in float:
// on these operands it equals the correctly rounded sum, which is not one of ATen's loops.)
TEST(Bf16LoopMatmul, TheProbesOperandsTellOrdersApart) {
  at::manual_seed(6);
  const auto [a, b] = cancelling(0, 13, 211, 11);
  std::vector<std::pair<std::string, at::Tensor>> results;
  for (cpu::Bf16SumOrder order : kOrders) results.emplace_back(cpu::to_string(order), order_reference(a, b, order));
  const size_t ours = results.size();
  results.emplace_back("16 lanes", lane_sum_reference(a, b, 16));
  results.emplace_back("32 lanes", lane_sum_reference(a, b, 32));
  results.emplace_back("2 lanes", lane_sum_reference(a, b, 2));
  results.emplace_back("a sum in double", double_sum_reference(a, b));
  for (size_t i = 0; i < ours; ++i)
    for (size_t j = i + 1; j < results.size(); ++j) {
      if (results[i].first == "running" && results[j].first == "a sum in double") continue;
      const int64_t differ =
          results[i].second.view(at::kShort).ne(results[j].second.view(at::kShort)).sum().item<int64_t>();
      EXPECT_GT(differ, results[i].second.numel() / 2)
          << results[i].first << " and " << results[j].first << " must differ in most outputs: " << differ;
    }
}

// The exact path's orthogonalizers as src/math/ortho.cpp writes them, in ATen's ops alone.
at::Tensor newton_schulz_aten(const at::Tensor& G) {
  const bool tall = G.size(-2) > G.size(-1);
  at::Tensor X = G.to(at::kBFloat16);
  if (tall) X = X.mT();
  X = X / (at::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, true) + 1e-7);
  for (const auto& k : dion::math::detail::kNewtonSchulz) {
    const at::Tensor A = at::matmul(X, X.mT());
    const at::Tensor B = A * k.b + at::matmul(A, A) * k.c;
    X = X * k.a + at::matmul(B, X);
  }
  return tall ? X.mT() : X;
}

at::Tensor polar_express_aten(const at::Tensor& G) {
  const bool tall = G.size(-2) > G.size(-1);
  at::Tensor X = G.to(at::kBFloat16);
  X = X / (at::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, true) * 1.02 + 1e-7);
  for (const auto& k : dion::math::detail::kPolarExpress) {
    const at::Tensor A = tall ? at::matmul(X.mT(), X) : at::matmul(X, X.mT());
    const at::Tensor B = A * k.b + at::matmul(A, A) * k.c;
    X = tall ? X * k.a + at::matmul(X, B) : X * k.a + at::matmul(B, X);
  }
  return X;
}

TEST(Bf16LoopMatmul, OrthogonalizersEqualThemThroughAten) {
  at::manual_seed(7);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{48, 80}, {80, 48}, {3, 40, 24}, {2, 24, 40}, {64, 64}}) {
    const at::Tensor G = at::randn(shape);
    EXPECT_TRUE(bit_identical(dion::math::newton_schulz(G, 1e-7, at::kBFloat16), newton_schulz_aten(G)))
        << "newton_schulz, shape " << G.sizes();
    EXPECT_TRUE(bit_identical(dion::math::polar_express(G, 1e-7, at::kBFloat16), polar_express_aten(G)))
        << "polar_express, shape " << G.sizes();
  }
}

TEST(Bf16LoopMatmul, RefusesWhatItDoesNotCompute) {
  const at::Tensor a = at::randn({4, 8}).to(at::kBFloat16), b = at::randn({8, 5}).to(at::kBFloat16);
  EXPECT_THROW(cpu::bf16_matmul_in_order(a, b.t(), cpu::Bf16SumOrder::four_way), std::invalid_argument);          // k mismatch
  EXPECT_THROW(cpu::bf16_matmul_in_order(a.to(at::kFloat), b, cpu::Bf16SumOrder::four_way), std::invalid_argument);  // dtype
  EXPECT_THROW(cpu::bf16_matmul_in_order(a.unsqueeze(0), b, cpu::Bf16SumOrder::four_way), std::invalid_argument);   // 3-D x 2-D
  try {
    cpu::bf16_matmul_in_order(a, b.t(), cpu::Bf16SumOrder::four_way);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[5, 8]"), std::string::npos) << e.what();
  }
  // Empty and k = 0 as ATen: no outputs, and zeros.
  const at::Tensor z = at::empty({3, 0}, at::kBFloat16), w = at::empty({0, 4}, at::kBFloat16);
  if (cpu_has_avx2()) {
    EXPECT_TRUE(bit_identical(cpu::bf16_matmul_in_order(z, w, cpu::Bf16SumOrder::dot64), at::matmul(z, w)));
    EXPECT_EQ(cpu::bf16_matmul_in_order(at::empty({0, 3}, at::kBFloat16), at::empty({3, 2}, at::kBFloat16), cpu::Bf16SumOrder::running).numel(), 0);
  }
}

}  // namespace
