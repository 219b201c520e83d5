// The fast orthogonalizer path and Gram Newton-Schulz (dion/math/ortho.h, dion/math/symmetric.h).
//
// What this pins:
//   - symmetric products: the block-row path equals the full batched product up to summation
//     order, its result is exactly symmetric, and the mirror copies bits;
//   - orthogonalize_fast: the same singular-value bands as the exact path (tests/math/test_ortho.cpp
//     derives them: Polar Express [0.83, 1.17], Newton-Schulz [0.94, 1.17]) on every shape
//     class (batched small, block-row square, wide, tall), and a bounded distance to the exact
//     path's output;
//   - gram_newton_schulz: its band, rank-deficient and zero inputs, and the gram-newton-schulz
//     package's own output (tests/vectors/gram, tests/reference/make_gram_vectors.py);
//   - workspaces: a second call does not overwrite the first call's result;
//   - OrthoConfig: path / use_gram_newton_schulz dispatch, and an optimizer step on each path.
//
// Gram Newton-Schulz's band. Its coefficients (the package's Polar Express, safety 1.05) map a
// normalized singular value s in [3e-3, 1] to [0.8461, 1.1236] (the scalar composition in
// float64 on a 2e5-point grid). It computes in fp16 as the package does where the CPU
// multiplies fp16 natively, else in fp32 (dion/math/ortho.h; the no_fp16.* ctest run caps
// oneDNN at AVX512_CORE_BF16 to check that case here). Never in bf16: the Gram matrix R is a
// degree-2 quantity whose rounding error is then iterated, and in bf16 (3 fewer mantissa bits)
// the largest singular value at condition number 100 reached 1.25, 1.66 and 1.35 on three of
// these shapes (1.12-1.17 on the other two; 1.25-1.84 in an earlier measurement), where fp16
// stays at 1.12-1.15 and fp32 at 1.1236 on all of them.
// Asserted: [0.80, 1.20] (about 40 fp16 ulps outside the float64 band, room for the bf16-like
// cases above to fail; a missed restart reaches 30-700 on the rank-deficient input). fp32
// rounds 2^13 times finer than fp16, so the same band holds for it with room.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/Utils.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dion/dion.h"
#include "dion/math/bf16_matmul_cpu.h"
#include "dion/math/symmetric.h"
#include "matrices.h"
#include "product_bounds.h"
#include "safetensors.h"

namespace {

using dion::math::OrthoMethod;
using dion::testing::all_finite;
using dion::testing::conditioned;
using dion::testing::max_abs_diff;
using dion::testing::svdvals;

// Shapes that take each code path (dion/math/symmetric.h): batched (small), block rows from
// 1024 rows (square, with a short last block merged: 1030 = 4 x 256 + 6) and from 512 rows
// with a long reduction (520 x 2100), tall (Gram matrix X^T X, polynomial from the right).
const std::vector<std::vector<int64_t>> kFastShapes = {
    {3, 48, 160}, {2, 96, 32}, {1, 1030, 1030}, {1, 520, 2100}, {1, 2100, 520}};

double rel_fro(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = a.to(at::kDouble) - b.to(at::kDouble);
  return (d.norm() / b.to(at::kDouble).norm()).item<double>();
}

// Sets an environment variable (nullptr: unsets it) for one scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// What Gram NS computes in here when no dtype is given (fp16 or fp32: see ortho.h).
at::ScalarType gram_cpu_dtype() { return dion::math::cpu_compute_dtype(at::kHalf).dtype; }

// ---------------------------------------------------------------------------- symmetric

// fp32: the block rows call the same GEMM on sub-blocks, so each entry is the same dot
// product, possibly summed in another order: a few fp32 ulps of the largest entry (|P| ~ K for
// unit normal inputs). Asserted 1e-5 relative to max |P|; a wrong block
// (offset by one block, missing mirror) is off by O(1) relative.
TEST(Symmetric, BlockRowsMatchTheFullProduct) {
  at::manual_seed(3);
  // (m, k): batched, batched, block rows from 1024 rows, block rows for a long reduction.
  for (auto [m, k] : std::vector<std::pair<int64_t, int64_t>>{{100, 300}, {600, 300}, {1030, 300}, {520, 2100}}) {
    const at::Tensor X = at::randn({2, m, k});
    const at::Tensor S = at::matmul(X, X.mT()) / static_cast<double>(k);  // symmetric
    at::Tensor P = at::empty({2, m, m}), Q = at::empty({2, m, m});
    dion::math::gram_out(P, X, /*tiled=*/true);
    dion::math::gram_out(Q, X, /*tiled=*/false);
    const double scale = Q.abs().max().item<double>();
    EXPECT_LE(max_abs_diff(P, Q) / scale, 1e-5) << "gram m=" << m;
    // Exactly symmetric where the block rows and the mirror run (the rule below); below that,
    // gram_out is one full GEMM, X X^T, which need not sum (i, j) and (j, i) in the same order:
    // the AVX-512 kernels of an AMD Zen 4 / 5 and an AMX Xeon happen to, the AVX2 ones do not
    // (m = 100 differed in the last bits under the AVX2 caps on an AMX Xeon, 2026-12-06). There
    // it is symmetric to a few fp32 ulps of the largest entry.
    const bool block_rows = m >= dion::math::kSymmetricMinRows ||
                            (m >= dion::math::kSymmetricMinRowsLongK && k >= dion::math::kSymmetricLongK);
    if (block_rows)
      EXPECT_TRUE(at::equal(P, P.mT())) << "gram m=" << m;
    else
      EXPECT_LE(max_abs_diff(P, P.mT()) / scale, 1e-6) << "gram m=" << m;
    // b S + c S S, a symmetric product of two symmetric matrices.
    dion::math::symmetric_product_out(P, S, S, S, -2.5, 0.75, true);
    dion::math::symmetric_product_out(Q, S, S, S, -2.5, 0.75, false);
    EXPECT_LE(max_abs_diff(P, Q) / Q.abs().max().item<double>(), 1e-5) << "product m=" << m;
    // Exactly symmetric when mirrored (block rows; the reduction of S S is m long). One full
    // GEMM is symmetric only up to rounding: it may sum (i, j) and (j, i) in other orders.
    if (m >= dion::math::kSymmetricMinRows ||
        (m >= dion::math::kSymmetricMinRowsLongK && m >= dion::math::kSymmetricLongK)) {
      EXPECT_TRUE(at::equal(P, P.mT())) << "product m=" << m;
    }
  }
}

TEST(Symmetric, MirrorCopiesTheLowerTriangleExactly) {
  at::manual_seed(4);
  for (at::ScalarType dt : {at::kBFloat16, at::kFloat, at::kDouble}) {
    const at::Tensor A = at::randn({3, 37, 37}).to(dt);
    at::Tensor P = A.clone();
    dion::math::mirror_lower_to_upper(P);
    EXPECT_TRUE(at::equal(P.tril(), A.tril())) << dt;          // lower and diagonal kept
    EXPECT_TRUE(at::equal(P.triu(1), A.tril(-1).mT())) << dt;  // upper = lower^T, bit for bit
  }
  at::Tensor bad = at::zeros({2, 3, 4});
  EXPECT_THROW(dion::math::mirror_lower_to_upper(bad), c10::Error);
}

// fp16 / bf16 where the CPU's GEMMs in that dtype are not native (dion/math/symmetric.h): the
// result is the fp32 product of the operands' values (what the same functions compute on fp32
// copies) rounded to the dtype once, bit for bit, and exactly symmetric where mirrored (block rows).
// cpu_has_native_gemm reads ONEDNN_MAX_CPU_ISA at each call, so under AVX2 every CPU takes this
// route for both dtypes (ATen's own kernels do not change in-process). Without the route the
// products are ATen's: oneDNN's bf16 kernels or ATen's loops, which sum in other orders (the
// printed counts: entries that differ from the fp32 route when the cap is lifted; an AMD Zen 5,
// bf16: 0 / 0 / 0 of the small batch, 66 / 46 / 4 of 520 x 2100, 2026-12-07).
TEST(Symmetric, HalfProductsWithoutNativeGemmsMultiplyInFp32) {
  at::manual_seed(11);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    // (B, m, k): batched small, and block rows for a long reduction (520 x 2100).
    for (auto [b, m, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{3, 48, 160}, {1, 520, 2100}}) {
      const at::Tensor X = (at::randn({b, m, k}) / 8).to(dt);
      const at::Tensor R = at::randn({b, m, m});
      const at::Tensor S = (R + R.mT()).to(dt);
      const at::Tensor Y = at::randn({b, k, 40}).to(dt);
      const at::Tensor Xf = X.to(at::kFloat), Sf = S.to(at::kFloat), Yf = Y.to(at::kFloat);
      at::Tensor want_gram = at::empty({b, m, m}), want_sym = at::empty({b, m, m}), want_prod = at::empty({b, m, 40});
      dion::math::gram_out(want_gram, Xf);
      dion::math::symmetric_product_out(want_sym, Xf, Xf.mT(), Sf, -0.5, 2.0);
      dion::math::batched_product_out(want_prod, Xf, Yf, at::Tensor(), 0.0, 1.0);
      auto run = [&](at::Tensor& gram, at::Tensor& sym, at::Tensor& prod) {
        gram = at::empty({b, m, m}, X.options()), sym = at::empty_like(gram), prod = at::empty({b, m, 40}, X.options());
        dion::math::gram_out(gram, X);
        dion::math::symmetric_product_out(sym, X, X.mT(), S, -0.5, 2.0);
        dion::math::batched_product_out(prod, X, Y, at::Tensor(), 0.0, 1.0);
      };
      at::Tensor gram, sym, prod;
      {
        ScopedEnv cap("ONEDNN_MAX_CPU_ISA", "AVX2"), no_legacy("DNNL_MAX_CPU_ISA", nullptr);
        ASSERT_TRUE(dion::math::half_product_in_fp32(at::empty({1}, X.options())));
        run(gram, sym, prod);
      }
      EXPECT_TRUE(at::equal(gram, want_gram.to(dt))) << "gram m=" << m;
      EXPECT_TRUE(at::equal(sym, want_sym.to(dt))) << "symmetric product m=" << m;
      EXPECT_TRUE(at::equal(prod, want_prod.to(dt))) << "product m=" << m;
      if (m >= dion::math::kSymmetricMinRowsLongK && k >= dion::math::kSymmetricLongK) {  // block rows, mirrored
        EXPECT_TRUE(at::equal(gram, gram.mT()) && at::equal(sym, sym.mT())) << "m=" << m;
      }
      if (!dion::math::half_product_in_fp32(gram)) {  // this CPU multiplies dt natively: compare
        at::Tensor g2, s2, p2;
        run(g2, s2, p2);
        std::printf("%s [%ld, %ld, %ld], native products against the fp32 route: %ld / %ld / %ld entries differ\n",
                    c10::toString(dt), long(b), long(m), long(k), long(g2.ne(gram).sum().item<int64_t>()),
                    long(s2.ne(sym).sum().item<int64_t>()), long(p2.ne(prod).sum().item<int64_t>()));
      }
    }
  }
  at::Tensor out = at::empty({1, 8, 8});
  EXPECT_THROW(dion::math::batched_product_out(out, at::randn({1, 8, 5}), at::randn({1, 4, 8}), {}, 0, 1),
               c10::Error);
}

// The batched block-row path (the one CUDA takes: one 3-D product per block row over the whole
// batch) run on the CPU with forced small heights, odd sizes and batches: equal to the full
// product within product_difference_bound (tests/support/product_bounds.h derives it), exactly
// symmetric, and every entry written (P starts as NaN). Heights: 7 and 16 (many blocks, a
// merged short last block: 37 = 4 x 7 + 9, 130 = 8 x 16 + 2), 100, and one above m (one block).
TEST(Symmetric, BatchedBlockRowsMatchTheFullProduct) {
  at::manual_seed(6);
  struct Case {
    int64_t batch, m, k, rows;
  };
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    for (const Case& c : {Case{3, 37, 50, 7}, Case{2, 130, 300, 16}, Case{1, 257, 64, 100}, Case{2, 45, 20, 64}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " B " + std::to_string(c.batch) + " m " + std::to_string(c.m) +
                   " k " + std::to_string(c.k) + " rows " + std::to_string(c.rows));
      const at::Tensor X = dion::testing::offset_rows({c.batch, c.m, c.k}, at::TensorOptions().dtype(dt));
      at::Tensor P = at::full({c.batch, c.m, c.m}, NAN, X.options());
      dion::math::symmetric_product_block_rows_out(P, X, X.mT(), at::Tensor(), 0.0, 1.0, c.rows);
      const at::Tensor Q = at::matmul(X, X.mT());
      EXPECT_LE(max_abs_diff(P, Q), dion::testing::product_difference_bound(X, X.mT(), 1.0, {}, 0.0, Q)) << "gram";
      EXPECT_TRUE(at::equal(P, P.mT())) << "gram";
      // b S + c S S with S symmetric (S S's reduction is m long), into a NaN-filled P again.
      const at::Tensor S = (Q / static_cast<double>(c.k)).contiguous();
      P.fill_(NAN);
      dion::math::symmetric_product_block_rows_out(P, S, S, S, -2.5, 0.75, c.rows);
      const at::Tensor R = at::baddbmm(S, S, S, -2.5, 0.75);
      EXPECT_LE(max_abs_diff(P, R), dion::testing::product_difference_bound(S, S, 0.75, S, -2.5, R)) << "product";
      EXPECT_TRUE(at::equal(P, P.mT())) << "product";
    }
  }
  at::Tensor P = at::empty({1, 8, 8});
  EXPECT_THROW(dion::math::symmetric_product_block_rows_out(P, at::randn({1, 8, 3}), at::randn({1, 3, 8}), {}, 0, 1, 0),
               c10::Error);
}

// The CUDA block height (dion/math/symmetric.h gives the reasons): the 160M model's shapes on an
// H200's 132 SMs, and the rule's promises on a grid of batches, sizes and SM counts.
TEST(Symmetric, CudaBlockRowsRule) {
  using dion::math::cuda_symmetric_block_rows;
  EXPECT_EQ(cuda_symmetric_block_rows(48, 768, 132), 256);   // 3 block rows: 192 tiles in the first
  EXPECT_EQ(cuda_symmetric_block_rows(12, 768, 132), 512);   // 2 block rows: 192 tiles
  EXPECT_EQ(cuda_symmetric_block_rows(4, 2048, 132), 768);   // 3 block rows: 144 tiles
  EXPECT_EQ(cuda_symmetric_block_rows(1, 4096, 132), 1536);  // 3 block rows: 144 tiles
  EXPECT_EQ(cuda_symmetric_block_rows(1, 768, 132), 0);      // one matrix cannot fill the GPU twice
  EXPECT_EQ(cuda_symmetric_block_rows(1000, 511, 132), 0);   // below kCudaSymmetricMinRows
  EXPECT_EQ(cuda_symmetric_block_rows(48, 768, 0), 0);       // no CUDA kernels
  for (int64_t sms : {16, 108, 132, 170})
    for (int64_t batch : {1, 2, 5, 12, 48, 200})
      for (int64_t m = 256; m <= 8192; m += 96) {
        const int64_t rows = cuda_symmetric_block_rows(batch, m, sms);
        if (rows == 0) continue;
        SCOPED_TRACE("sms " + std::to_string(sms) + " B " + std::to_string(batch) + " m " + std::to_string(m));
        EXPECT_GE(m, dion::math::kCudaSymmetricMinRows);
        EXPECT_EQ(rows % dion::math::kCudaSymmetricTile, 0);
        const int64_t tiles = rows / dion::math::kCudaSymmetricTile;
        EXPECT_GE(batch * tiles * tiles, sms);                     // the first block row fills a wave
        EXPECT_GE(m - rows, rows / 2);                             // >= 2 block rows after the merge
        EXPECT_LE(m / rows, dion::math::kCudaSymmetricMaxBlocks);  // <= 4 block rows
      }
}

TEST(Symmetric, ShapeErrorsNameTheShapes) {
  at::Tensor P = at::empty({1, 8, 8});
  try {
    dion::math::symmetric_product_out(P, at::randn({1, 8, 5}), at::randn({1, 4, 8}), {}, 0, 1);
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "do not chain", e.what());
  }
}

// ---------------------------------------------------------------------------- fast path

// Accuracy against the exact path. Both compute the same polynomial in bf16; the fast path
// rounds b A + c A^2 and a X + B X once (fused in the GEMM) where the exact path rounds each
// term, and sums block rows in another order, so the two bf16 outputs differ by bf16 rounding:
// measured 1.2-4.9e-2 relative Frobenius distance. The meaningful bound is against the
// exact iteration in fp32: the fast bf16 output must be as close to it as the exact bf16 output
// is (measured ratio 0.40-0.56: one rounding instead of two); asserted <= 1.25 x. A wrong
// coefficient or a missing step moves the output by 0.1 or more relative.
TEST(OrthoFast, SingularValueBandsAndAccuracy) {
  at::manual_seed(5);
  struct Band {
    OrthoMethod method;
    double lo, hi, eps;
  };
  for (const Band& b :
       {Band{OrthoMethod::POLAR_EXPRESS, 0.83, 1.17, 1e-6}, Band{OrthoMethod::NEWTON_SCHULZ, 0.94, 1.17, 1e-7}}) {
    for (const auto& shape : kFastShapes) {
      const at::Tensor G = conditioned(shape, 0.1);
      const at::Tensor U = dion::math::orthogonalize_fast(G, b.method, b.eps, at::kBFloat16);
      ASSERT_EQ(U.sizes(), G.sizes());
      ASSERT_EQ(U.scalar_type(), at::kBFloat16);
      const at::Tensor sv = svdvals(U);
      const double lo = sv.min().item<double>(), hi = sv.max().item<double>();
      auto exact = [&](at::ScalarType dt) {
        return b.method == OrthoMethod::POLAR_EXPRESS ? dion::math::polar_express(G, b.eps, dt)
                                                      : dion::math::newton_schulz(G, b.eps, dt);
      };
      const at::Tensor E16 = exact(at::kBFloat16), E32 = exact(at::kFloat);
      const double d_fast = rel_fro(U, E32), d_exact = rel_fro(E16, E32);
      std::printf(
          "fast %s [%ld, %ld, %ld]: sv [%.4f, %.4f]; rel. distance to exact fp32: "
          "fast %.2e, exact bf16 %.2e; fast to exact bf16 %.2e\n",
          dion::math::to_string(b.method).c_str(), long(shape[0]), long(shape[1]), long(shape[2]), lo, hi, d_fast,
          d_exact, rel_fro(U, E16));
      EXPECT_GE(lo, b.lo);
      EXPECT_LE(hi, b.hi);
      EXPECT_LE(d_fast, 1.25 * d_exact);
    }
  }
}

TEST(OrthoFast, FloatComputeIsCloseToExact) {
  // fp32: the only differences are summation order and the fused epilogues: 1e-5 relative
  // (measured about 1e-6).
  at::manual_seed(7);
  const at::Tensor G = conditioned({2, 64, 200}, 0.1);
  const at::Tensor U = dion::math::orthogonalize_fast(G, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kFloat);
  EXPECT_LE(rel_fro(U, dion::math::polar_express(G, 1e-6, at::kFloat)), 1e-5);
}

// With and without symmetric products (tiled = false: full batched products) on a block-row
// shape: the same bf16 iteration, products differing by rounding only. tests/cuda/test_cuda.cpp
// asserts 6e-2 relative Frobenius between the two on the GPU (5 iterations x 3 roundings of
// u = 2^-8); the same bound here. Measured on this CPU: 0 (oneDNN sums each entry of a block
// row in the order the full product does, so the two are bit-identical; on a GPU cuBLAS picks
// other kernels per shape). A result that skipped the mirror or used a wrong block is off by
// O(1).
TEST(OrthoFast, SymmetricProductsChangeOnlyRounding) {
  at::manual_seed(8);
  const at::Tensor G = conditioned({1, 1030, 1030}, 0.1);
  const at::Tensor U = dion::math::orthogonalize_fast(G, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16, true);
  const at::Tensor F = dion::math::orthogonalize_fast(G, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16, false);
  const double d = rel_fro(U, F);
  std::printf("polar express [1, 1030, 1030] bf16, symmetric vs full products: %.2e relative Frobenius\n", d);
  EXPECT_LE(d, 6e-2);
}

TEST(OrthoFast, ResultsAreNotWorkspaces) {
  // Two calls with the same shape share a workspace: the first result must survive the second.
  at::manual_seed(8);
  for (const auto& shape : kFastShapes) {
    const at::Tensor G1 = at::randn(shape), G2 = at::randn(shape);
    const at::Tensor U1 = dion::math::orthogonalize_fast(G1, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16);
    const at::Tensor keep = U1.clone();
    const at::Tensor U2 = dion::math::orthogonalize_fast(G2, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16);
    const at::Tensor V1 = dion::math::gram_newton_schulz(G1);
    const at::Tensor keep_v = V1.clone();
    dion::math::gram_newton_schulz(G2);
    EXPECT_TRUE(at::equal(U1, keep));
    EXPECT_TRUE(at::equal(V1, keep_v));
    EXPECT_FALSE(at::equal(U1, U2));
    // And the same input gives the same bits again (nothing left over from the last call).
    EXPECT_TRUE(at::equal(dion::math::orthogonalize_fast(G1, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16), keep));
  }
}

TEST(OrthoFast, ZeroMapsToZero) {
  for (const auto& shape : kFastShapes) {
    const at::Tensor Z = at::zeros(shape);
    EXPECT_TRUE(at::equal(dion::math::orthogonalize_fast(Z, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16),
                          Z.to(at::kBFloat16)));
    EXPECT_TRUE(at::equal(dion::math::gram_newton_schulz(Z), Z.to(at::kBFloat16)));
  }
}

// ---------------------------------------------------------------------------- Gram NS

// In the dtype this CPU picks: fp16 with native fp16 GEMMs, else fp32 (the ctest run under
// ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 checks fp32 here too). The band is fp16's (see the file
// comment); fp32 rounds 2^13 times finer, so the same band holds with room (measured in fp32:
// [0.8461, 1.1236] at condition 10, the float64 band to 4 digits).
TEST(GramNewtonSchulz, SingularValueBand) {
  at::manual_seed(9);
  const dion::math::CpuComputeDtype dt = dion::math::cpu_compute_dtype(at::kHalf);
  std::printf("gram NS on this CPU: %s\n", dt.reason.c_str());
  for (const auto& shape : kFastShapes) {
    for (double smin : {0.1, 0.01}) {
      const at::Tensor G = conditioned(shape, smin);
      const at::Tensor U = dion::math::gram_newton_schulz(G);
      ASSERT_EQ(U.scalar_type(), dt.dtype);
      ASSERT_TRUE(all_finite(U));
      const at::Tensor sv = svdvals(U);
      const double lo = sv.min().item<double>(), hi = sv.max().item<double>();
      std::printf("gram %s [%ld, %ld, %ld] cond %.0f: sv [%.4f, %.4f]\n",
                  dion::math::dtype_short_name(dt.dtype).c_str(), long(shape[0]), long(shape[1]), long(shape[2]),
                  1 / smin, lo, hi);
      EXPECT_LE(hi, 1.20);
      if (smin == 0.1) {  // normalized s >= 3e-3 only at condition 10
        EXPECT_GE(lo, 0.80);
      }
    }
  }
}

TEST(GramNewtonSchulz, RankDeficientStaysBounded) {
  // Rank 8 plus 1e-3 noise: the noise directions stay small, nothing blows up (without the
  // restart at step 2 the largest singular value reaches 30-700 here, in bf16).
  at::manual_seed(10);
  const at::Tensor G = at::matmul(at::randn({2, 256, 8}), at::randn({2, 8, 1024})) + 1e-3 * at::randn({2, 256, 1024});
  const at::Tensor U = dion::math::gram_newton_schulz(G);
  ASSERT_TRUE(all_finite(U));
  EXPECT_LE(svdvals(U).max().item<double>(), 1.20);
}

// Against the package itself (tests/vectors/gram, recorded in fp16 with its torch backend and no
// compilation). With dtype fp16 we run the same operations in the same order and orientation
// on the same kernels; only the square case differs (our normalization divides the fp16 copy,
// the package divides in fp32 first). Measured max |diff|: 0 for wide and tall, 8.5e-4 for
// square (under 3 fp16 ulps of entries up to 0.39). Without native fp16 (the no_fp16.* run, AMD
// CPUs) the fp16 products are fp32 products rounded once (dion/math/symmetric.h), summed in
// another order: 1.2-8.5e-4 (an AMD Zen 5; ATen's own fp16 loops there gave 3.7-7.9e-4). These
// matrices are under the block-row threshold, so tiled = true takes the same batched products.
// Asserted 2e-3.
// fp32 (what a CPU without native fp16 computes in) is compared with our own float64 iteration
// instead: the package's fp16 output is itself 0.7-1.7e-3 from it (its fp16 rounding), while
// fp32 measured 0.9-1.8e-6. Asserted 1e-5: about 430 fp32 roundings of the largest entries
// (2^-24 x 0.39 = 2.3e-8), some 20 for each of the ~20 products the iteration compounds, and
// 19x under one fp16 rounding of them (2^-11 x 0.39 = 1.9e-4), so a step left in fp16 fails.
TEST(GramNewtonSchulz, MatchesTheGramNewtonSchulzPackage) {
  const auto st = dion::testing::load_safetensors(std::string(DION_SOURCE_DIR) +
                                                  "/tests/vectors/gram/gram_newton_schulz.safetensors");
  for (const char* name : {"wide", "tall", "square", "wide_1to3"}) {
    const at::Tensor G = st.at(std::string(name) + ".G");
    const at::Tensor want = st.at(std::string(name) + ".U");
    const at::Tensor ours = dion::math::gram_newton_schulz(G, 1e-7, at::kHalf, /*tiled=*/false);
    const at::Tensor tiled = dion::math::gram_newton_schulz(G, 1e-7, at::kHalf, true);
    const double d = max_abs_diff(ours, want), dt = max_abs_diff(tiled, want);
    const at::Tensor f32 = dion::math::gram_newton_schulz(G, 1e-7, at::kFloat, true);
    const at::Tensor f64 = dion::math::gram_newton_schulz(G, 1e-7, at::kDouble, false);
    const double d32 = max_abs_diff(f32, f64);
    std::printf(
        "package %s: max |diff| untiled %.2e, tiled %.2e (max |U| %.3f); fp32 to fp64 %.2e, "
        "package to fp64 %.2e\n",
        name, d, dt, want.abs().max().item<double>(), d32, max_abs_diff(want, f64));
    EXPECT_LE(d, 2e-3) << name;
    EXPECT_LE(dt, 2e-3) << name;
    EXPECT_LE(d32, 1e-5) << name;
  }
}

// ---------------------------------------------------------------------------- CPU compute dtype

bool cpu_flag(const char* name) {
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto it = caps.find(name);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

// The rule of dion/math/ortho.h on this CPU's flags under every kind of ISA cap: the rule reads
// ONEDNN_MAX_CPU_ISA at each call, so one machine plays the others (oneDNN itself read the
// cap once at start; its kernels do not change here: dion-bench measures those, docs/benchmarks.md).
// With AVX512-FP16 and no cap: fp16; capped at AVX512_CORE_BF16 (an AMD Zen 4's ISA): fp32,
// never bf16; bf16 stays bf16 where AVX512-BF16 is allowed. Without the flags: fp32 always.
TEST(CpuComputeDtype, Fp16OnlyWhereTheCpuMultipliesFp16) {
  ScopedEnv no_override("DION_FAST_CPU_DTYPE", nullptr), no_legacy("DNNL_MAX_CPU_ISA", nullptr);
  const bool fp16 = cpu_flag("avx512_fp16") || cpu_flag("amx_fp16");
  const bool bf16 = cpu_flag("avx512_bf16") || cpu_flag("amx_bf16");
  struct Case {
    const char* cap;
    bool allows_fp16, allows_bf16;
  };
  const Case cases[] = {{nullptr, true, true},
                        {"AVX512_CORE_FP16", true, true},
                        {"avx10_1_512", true, true},
                        {"AVX512_CORE_AMX", true, true},
                        {"ALL", true, true},
                        {"no_such_isa", true, true},
                        {"AVX512_CORE_BF16", false, true},
                        {"AVX512_CORE", false, false},
                        {"AVX2", false, false}};
  for (const Case& c : cases) {
    ScopedEnv cap("ONEDNN_MAX_CPU_ISA", c.cap);
    SCOPED_TRACE(std::string("ONEDNN_MAX_CPU_ISA=") + (c.cap ? c.cap : "(unset)"));
    const auto h = dion::math::cpu_compute_dtype(at::kHalf), b = dion::math::cpu_compute_dtype(at::kBFloat16);
    std::printf("cap %-16s fp16 -> %s\n                      bf16 -> %s\n", c.cap ? c.cap : "(none)", h.reason.c_str(),
                b.reason.c_str());
    EXPECT_EQ(h.dtype, fp16 && c.allows_fp16 ? at::kHalf : at::kFloat) << h.reason;
    EXPECT_EQ(b.dtype, bf16 && c.allows_bf16 ? at::kBFloat16 : at::kFloat) << b.reason;
    EXPECT_EQ(dion::math::cpu_has_native_gemm(at::kHalf), h.dtype == at::kHalf);
    EXPECT_EQ(dion::math::cpu_compute_dtype(at::kFloat).dtype, at::kFloat);
    if (fp16 && !c.allows_fp16) {  // the reason names the cap
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string("ONEDNN_MAX_CPU_ISA=") + c.cap, h.reason);
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, "below AVX512_CORE_FP16", h.reason);
    }
  }
  // oneDNN's older name for the cap, and the newer one wins over it.
  ScopedEnv no_cap("ONEDNN_MAX_CPU_ISA", nullptr);
  {
    ScopedEnv legacy("DNNL_MAX_CPU_ISA", "AVX2");
    EXPECT_EQ(dion::math::cpu_compute_dtype(at::kHalf).dtype, at::kFloat);
    ScopedEnv newer("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_FP16");
    EXPECT_EQ(dion::math::cpu_compute_dtype(at::kHalf).dtype, fp16 ? at::kHalf : at::kFloat);
  }
}

TEST(CpuComputeDtype, OverrideAndNames) {
  for (const char* name : {"fp16", "bf16", "fp32"}) {
    ScopedEnv o("DION_FAST_CPU_DTYPE", name);
    const auto c = dion::math::cpu_compute_dtype(at::kHalf);
    EXPECT_EQ(dion::math::dtype_short_name(c.dtype), name);
    EXPECT_EQ(c.reason, std::string(name) + ": DION_FAST_CPU_DTYPE=" + name);
    EXPECT_EQ(dion::math::cpu_dtype_from_string(name), c.dtype);
  }
  {
    ScopedEnv o("DION_FAST_CPU_DTYPE", "auto");
    ScopedEnv cap("ONEDNN_MAX_CPU_ISA", "AVX2");
    EXPECT_EQ(dion::math::cpu_compute_dtype(at::kHalf).dtype, at::kFloat);
  }
  ScopedEnv bad("DION_FAST_CPU_DTYPE", "fp8");
  try {
    dion::math::cpu_compute_dtype(at::kHalf);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "DION_FAST_CPU_DTYPE: unknown CPU compute dtype 'fp8'", e.what());
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "'fp16', 'bf16' and 'fp32'", e.what());
  }
}

// (How fast fp16 really runs under each cap is measured by dion-bench, not asserted here:
// docs/benchmarks.md, "CPU compute dtype"; the rule above is tested on the flags and caps.)

// ---------------------------------------------------------------------------- configuration

// The exact path in a dtype whose GEMMs are not native (emulated: oneDNN capped at AVX2, as on an
// AVX2-only CPU) runs ATen's scalar fallback, 30-100x slower than fp32: said once per process,
// naming the fast path; nothing is said for fp32, nor for bf16 where the library reproduces ATen's
// bf16 loops at speed (dion/math/bf16_matmul_cpu.h: every AVX2 CPU); fp16 has no such kernel.
TEST(OrthoConfigPaths, ExactPathInSlowDtypeWarnsOnce) {
  struct Collect : c10::WarningHandler {
    std::vector<std::string> messages;
    void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
  } collect;
  c10::WarningUtils::WarningHandlerGuard guard(&collect);
  ScopedEnv cap("ONEDNN_MAX_CPU_ISA", "AVX2");
  dion::math::OrthoConfig c;
  c.dtype = at::kFloat;
  (void)c.function()(at::randn({8, 12}), 1e-7);
  EXPECT_TRUE(collect.messages.empty());
  c.dtype = at::kBFloat16;
  for (int i = 0; i < 3; ++i) (void)c.function()(at::randn({8, 12}), 1e-7);
  const bool bf16_at_speed = dion::math::cpu::aten_bf16_order_confirmed(dion::math::cpu::Bf16SumOrder::four_way);
  ASSERT_EQ(collect.messages.size(), bf16_at_speed ? 0u : 1u);
  c.dtype = at::kHalf;
  for (int i = 0; i < 3; ++i) (void)c.function()(at::randn({8, 12}), 1e-7);
  ASSERT_EQ(collect.messages.size(), bf16_at_speed ? 1u : 2u);
  const std::string& said = collect.messages.back();
  for (const char* part : {"exact orthogonalization computes in fp16", "scalar fallback", "fast path",
                           "set_ortho_path(\"fast\")", "OrthoPath::FAST"})
    EXPECT_NE(said.find(part), std::string::npos) << part << " not in: " << said;
}

TEST(OrthoConfigPaths, DispatchAndNames) {
  at::manual_seed(11);
  const at::Tensor G = at::randn({2, 24, 40});
  dion::math::OrthoConfig c;
  EXPECT_EQ(c.path, dion::math::OrthoPath::EXACT);  // the reference's bits by default
  EXPECT_EQ(c.cpu_compute().dtype, at::kBFloat16);
  c.path = dion::math::OrthoPath::FAST;
  // On the CPU the FAST path computes in cpu_compute_dtype(bf16) and returns the config's dtype.
  const at::ScalarType fast_dt = dion::math::cpu_compute_dtype(at::kBFloat16).dtype;
  EXPECT_EQ(c.cpu_compute().dtype, fast_dt);
  const at::Tensor U = c.function()(G, 1e-6);
  EXPECT_EQ(U.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(
      at::equal(U, dion::math::orthogonalize_fast(G, OrthoMethod::POLAR_EXPRESS, 1e-6, fast_dt).to(at::kBFloat16)));
  c.use_gram_newton_schulz = true;
  // Gram NS: cpu_compute_dtype(fp16), the result in fp16 as the reference returns it.
  EXPECT_EQ(c.cpu_compute().dtype, gram_cpu_dtype());
  const at::Tensor V = c.function()(G, 1e-6);
  EXPECT_EQ(V.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(V, dion::math::gram_newton_schulz(G, 1e-7).to(at::kHalf)));
  // An explicit cpu_dtype wins over the rule and the override; the override over the rule.
  {
    ScopedEnv o("DION_FAST_CPU_DTYPE", "bf16");
    EXPECT_EQ(c.cpu_compute().dtype, at::kBFloat16);
    EXPECT_TRUE(at::equal(c.function()(G, 1e-6), dion::math::gram_newton_schulz(G, 1e-7, at::kBFloat16).to(at::kHalf)));
    c.cpu_dtype = at::kFloat;
    EXPECT_EQ(c.cpu_compute().reason, "fp32: OrthoConfig::cpu_dtype");
    EXPECT_TRUE(at::equal(c.function()(G, 1e-6), dion::math::gram_newton_schulz(G, 1e-7, at::kFloat).to(at::kHalf)));
    c.use_gram_newton_schulz = false;
    const at::Tensor F = dion::math::orthogonalize_fast(G, OrthoMethod::POLAR_EXPRESS, 1e-6, at::kFloat);
    EXPECT_TRUE(at::equal(c.function()(G, 1e-6), F.to(at::kBFloat16)));
  }
  for (auto p : {dion::math::OrthoPath::EXACT, dion::math::OrthoPath::FAST})
    EXPECT_EQ(dion::math::ortho_path_from_string(dion::math::to_string(p)), p);
  EXPECT_THROW(dion::math::ortho_path_from_string("quick"), std::invalid_argument);
}

// Every Newton-Schulz algorithm runs on each path; after 3 steps the parameters are within
// bf16 rounding of the exact path's (relative 2e-2 of the largest entry: lr 0.02 times a
// bf16-rounded update, accumulated 3 times, is far below; a wrong orthogonalizer changes the
// update by O(1) and the parameters by ~lr relative).
TEST(OrthoConfigPaths, OptimizersStepOnEveryPath) {
  for (const char* algo : {"muon", "normuon", "dion2", "nordion2"}) {
    std::vector<at::Tensor> finals;
    for (int path = 0; path < 3; ++path) {
      at::manual_seed(12);
      std::vector<at::Tensor> ps = {at::randn({64, 64}), at::randn({48, 160}), at::randn({160, 48})};
      for (auto& p : ps) p.mutable_grad() = at::randn(p.sizes());
      dion::math::OrthoConfig o;
      o.path = path == 0 ? dion::math::OrthoPath::EXACT : dion::math::OrthoPath::FAST;
      o.use_gram_newton_schulz = path == 2;
      dion::Optimizer opt(std::vector<dion::ParamGroup>{{ps}}, dion::Options(0.02).algorithm(algo), o);
      const at::Tensor before = ps[1].clone();
      for (int s = 0; s < 3; ++s) opt.step();
      ASSERT_FALSE(at::equal(before, ps[1])) << algo;
      finals.push_back(at::cat({ps[0].flatten(), ps[1].flatten(), ps[2].flatten()}));
    }
    const double scale = finals[0].abs().max().item<double>();
    EXPECT_LE(max_abs_diff(finals[1], finals[0]) / scale, 2e-2) << algo << " fast";
    EXPECT_LE(max_abs_diff(finals[2], finals[0]) / scale, 2e-2) << algo << " gram";
  }
}

}  // namespace
