// Orthogonalizer properties: Newton-Schulz and Polar Express (dion/math/ortho.h).
//
// What this pins: the contract the optimizers rely on, checked on the outputs themselves rather
// than against stored vectors (tests/optim/test_reference.cpp does that): singular values of the
// output lie in the band the coefficients promise, ill-conditioned and rank-deficient inputs
// neither blow up nor produce NaN, zero maps to exactly zero, shapes and dtypes are kept,
// batching changes nothing, a user-supplied OrthoFn is what the optimizer calls, and
// orthogonalize_megabatch splits, rescales and flattens as documented.
//
// Singular values are measured in float64 (at::linalg_svdvals on the output cast to double).
//
// The bands. Both iterations map each singular value s of G / (||G||_F [* 1.02]) through a
// fixed odd quintic polynomial applied five times. Evaluating that scalar composition in
// float64 on a fine grid gives, for normalized s in [3e-3, 1] (Newton-Schulz) and [1e-3, 1]
// (Polar Express, which also divides by 1.02):
//     newton_schulz   [0.9778, 1.1450]      polar_express   [0.8589, 1.1411]
// and measured with these kernels on random matrices of condition number 10 and 100 in every
// shape used below (the well-conditioned test below prints its own, narrower, measurement):
//     newton_schulz   fp32 [0.9778, 1.1450]   bf16 [0.9607, 1.1480]
//     polar_express   fp32 [0.8589, 1.1411]   bf16 [0.8481, 1.1496]
// The asserted bands add about 2-3 bf16 ulps (2^-7 = 7.8e-3 near 1) on each side of the bf16
// measurement: Newton-Schulz [0.94, 1.17], Polar Express [0.83, 1.17]. Below the thresholds the
// polynomial is nearly linear with slope prod(a_i): 492 (Newton-Schulz), 989 (Polar Express),
// so a tiny singular value is amplified by at most about 1000x and never past the upper bound.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "dion/dion.h"
#include "dion/math/dion.h"
#include "matrices.h"

namespace {

using dion::math::OrthoMethod;

// ---------------------------------------------------------------------------- helpers

struct OrthoCase {
  const char* name;
  OrthoMethod method;
  at::ScalarType dtype;
  double lo, hi;     // asserted singular-value band (see the file comment)
  double slope;      // small-value gain bound: prod(a_i), rounded up
  double threshold;  // normalized singular values above this converge into [lo, hi]
};

const OrthoCase kCases[] = {
    {"newton_schulz_fp32", OrthoMethod::NEWTON_SCHULZ, at::kFloat, 0.94, 1.17, 500.0, 3e-3},
    {"newton_schulz_bf16", OrthoMethod::NEWTON_SCHULZ, at::kBFloat16, 0.94, 1.17, 500.0, 3e-3},
    {"polar_express_fp32", OrthoMethod::POLAR_EXPRESS, at::kFloat, 0.83, 1.17, 1000.0, 1e-3},
    {"polar_express_bf16", OrthoMethod::POLAR_EXPRESS, at::kBFloat16, 0.83, 1.17, 1000.0, 1e-3},
};

at::Tensor run(const OrthoCase& c, const at::Tensor& G) {
  return c.method == OrthoMethod::POLAR_EXPRESS ? dion::math::polar_express(G, 1e-6, c.dtype)
                                                : dion::math::newton_schulz(G, 1e-7, c.dtype);
}

std::string shape_str(at::IntArrayRef s) {
  std::string out("[");
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  out += "]";
  return out;
}

using dion::testing::all_finite;
using dion::testing::conditioned;
using dion::testing::max_abs_diff;
using dion::testing::svdvals;
using dion::testing::with_singular_values;

// Batched-vs-single tolerance. On CPU both paths run the same per-matrix GEMM kernels and the
// norms reduce each matrix on its own, so the results are bit-identical today (observed: max
// |diff| = 0 for every case). A different BLAS thread partitioning could reorder a reduction:
// that is a few ulps of the compute dtype, which the converged polynomial does not amplify
// (its slope near the fixed point is small). fp32: 1e-5 (~80 ulps at 1.0); bf16: 3e-2 (4 ulps
// at 1.0). A batching bug (matrices mixed up, one norm for the whole batch) moves entries by
// O(0.1), far outside either bound.
double batch_tolerance(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 3e-2 : 1e-5; }

const std::vector<std::vector<int64_t>> kShapes = {
    {64, 64},       {32, 96},       {96, 32}, {16, 256}, {256, 16}, {1, 50},  // square, wide, tall, a row
    {4, 32, 48},    {3, 48, 32},                                              // 3-D batches
    {2, 3, 40, 24}, {2, 2, 24, 40},                                           // 4-D batches
};

// gtest prints a failing case by name rather than as raw bytes.
void PrintTo(const OrthoCase& c, std::ostream* os) { *os << c.name; }

class Ortho : public ::testing::TestWithParam<OrthoCase> {};

// ---------------------------------------------------------------------------- bands

TEST_P(Ortho, WellConditionedSingularValuesInBand) {
  const OrthoCase& c = GetParam();
  at::manual_seed(1);
  double lo = 1e9, hi = 0;
  for (int trial = 0; trial < 3; ++trial) {
    for (const auto& shape : kShapes) {
      const at::Tensor G = conditioned(shape, 0.1);  // condition number <= 10
      const at::Tensor O = run(c, G);
      ASSERT_TRUE(all_finite(O)) << shape_str(shape);
      const at::Tensor sv = svdvals(O);
      const double smin = sv.min().item<double>(), smax = sv.max().item<double>();
      lo = std::min(lo, smin);
      hi = std::max(hi, smax);
      EXPECT_GE(smin, c.lo) << c.name << " " << shape_str(shape);
      EXPECT_LE(smax, c.hi) << c.name << " " << shape_str(shape);
    }
  }
  std::printf("[ band ] %-20s well-conditioned: singular values in [%.4f, %.4f]\n", c.name, lo, hi);
}

TEST_P(Ortho, IllConditionedLargeConvergeNoneExceedsBound) {
  // Singular values log-spaced from 1 down to 1e-6. After normalization by ||G||_F (about 1.7
  // here) the ones above the threshold converge into the band; the smaller ones are scaled by
  // at most the polynomial's slope; nothing exceeds the upper bound.
  const OrthoCase& c = GetParam();
  at::manual_seed(2);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{64, 64}, {48, 96}, {96, 48}}) {
    const int64_t m = shape[0], n = shape[1], k = std::min(m, n);
    const at::Tensor S = at::logspace(0.0, -6.0, k, 10.0, at::kDouble);
    at::Tensor U = std::get<0>(at::linalg_qr(at::randn({m, k}, at::kDouble)));
    at::Tensor V = std::get<0>(at::linalg_qr(at::randn({n, k}, at::kDouble)));
    const at::Tensor G = at::matmul(U * S, V.mT()).to(at::kFloat);
    const at::Tensor O = run(c, G);
    ASSERT_TRUE(all_finite(O)) << c.name << " " << shape_str(shape);
    EXPECT_LE(svdvals(O).max().item<double>(), c.hi) << c.name << " " << shape_str(shape);

    // Where each input direction went: d_i = u_i^T O v_i = p(s_i) in exact arithmetic.
    const at::Tensor d = at::diagonal(at::matmul(at::matmul(U.mT(), O.to(at::kDouble)), V));
    const at::Tensor s_norm = S / at::linalg_vector_norm(S, 2);
    int converged = 0;
    for (int64_t i = 0; i < k; ++i) {
      const double s = s_norm[i].item<double>(), di = d[i].item<double>();
      if (s >= 3 * c.threshold) {  // a factor 3 above the threshold: in the band
        EXPECT_GE(di, c.lo) << c.name << " s_norm " << s;
        EXPECT_LE(di, c.hi) << c.name << " s_norm " << s;
        ++converged;
      } else if (c.dtype == at::kFloat && s < 1e-5) {
        // fp32 only: bf16 rounding of the input (2^-9 relative) swamps directions this small.
        // Bound: the polynomial's slope times s, plus 1e-3 for fp32 rounding noise (~1e-7
        // relative per op) amplified by the same <= 1000x slope.
        EXPECT_LE(std::abs(di), c.slope * s + 1e-3) << c.name << " s_norm " << s;
      }
    }
    EXPECT_GE(converged, 10) << "the test should exercise some large singular values";
  }
}

TEST_P(Ortho, RankDeficientZerosStayZero) {
  const OrthoCase& c = GetParam();
  at::manual_seed(3);
  // (a) Exact rank deficiency in any dtype: a well-conditioned 20 x 12 block inside zeros.
  // Zero rows and columns stay exactly zero through every X X^T, B X and a X of the iteration.
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{48, 32}, {32, 48}, {40, 40}}) {
    at::Tensor G = at::zeros(shape, at::kFloat);
    G.slice(0, 0, 20).slice(1, 0, 12).copy_(conditioned({20, 12}, 0.1));
    const at::Tensor O = run(c, G);
    ASSERT_TRUE(all_finite(O));
    at::Tensor outside = O.to(at::kFloat).clone();
    outside.slice(0, 0, 20).slice(1, 0, 12).zero_();
    EXPECT_TRUE(at::equal(outside, at::zeros_like(outside))) << c.name << " " << shape_str(shape);
    const at::Tensor sv = svdvals(O);  // descending
    EXPECT_GE(sv.slice(0, 0, 12).min().item<double>(), c.lo) << c.name << " " << shape_str(shape);
    EXPECT_LE(sv.max().item<double>(), c.hi) << c.name << " " << shape_str(shape);
    // Exact zeros in the matrix: what remains is float64 SVD round-off (~1e-16 of the norm).
    EXPECT_LE(sv.slice(0, 12).max().item<double>(), 1e-12) << c.name << " " << shape_str(shape);
  }
  // (b) A rank-8 product A B. In fp32 the null directions carry only rounding noise (~1e-7
  // relative), amplified by <= 1000x: measured <= 3e-5, asserted <= 1e-3. In bf16 the cast
  // itself makes the input full rank with noise at 2^-9 relative, which the iteration rightly
  // treats as small singular values and lifts (measured up to 0.78): there we only require
  // finiteness and the upper bound.
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{64, 48}, {48, 64}}) {
    const at::Tensor G = at::matmul(at::randn({shape[0], 8}), at::randn({8, shape[1]}));
    const at::Tensor O = run(c, G);
    ASSERT_TRUE(all_finite(O)) << c.name;
    const at::Tensor sv = svdvals(O);
    EXPECT_LE(sv.max().item<double>(), c.hi) << c.name;
    if (c.dtype == at::kFloat) {
      EXPECT_GE(sv.slice(0, 0, 8).min().item<double>(), c.lo) << c.name;
      EXPECT_LE(sv.slice(0, 8).max().item<double>(), 1e-3) << c.name;
    }
  }
}

// ---------------------------------------------------------------------------- edge cases

TEST_P(Ortho, AllZeroInputGivesExactZero) {
  const OrthoCase& c = GetParam();
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{16, 24}, {24, 16}, {16, 16}, {3, 16, 24}, {2, 2, 8, 8}}) {
    const at::Tensor O = run(c, at::zeros(shape, at::kFloat));
    EXPECT_FALSE(at::isnan(O).any().item<bool>()) << c.name << " " << shape_str(shape);
    EXPECT_TRUE(at::equal(O, at::zeros(shape, O.options()))) << c.name << " " << shape_str(shape);
  }
  // One zero matrix inside a batch stays zero and does not disturb its neighbours.
  at::manual_seed(4);
  at::Tensor G = conditioned({3, 16, 24}, 0.1);
  G[1].zero_();
  const at::Tensor O = run(c, G);
  EXPECT_TRUE(at::equal(O[1], at::zeros_like(O[1])));
  EXPECT_LE(max_abs_diff(O[0], run(c, G[0])), batch_tolerance(c.dtype));
}

TEST_P(Ortho, ShapeAndDtype) {
  const OrthoCase& c = GetParam();
  for (const auto& shape : kShapes) {
    for (at::ScalarType in : {at::kFloat, at::kBFloat16, at::kDouble}) {
      const at::Tensor O = run(c, at::randn(shape, at::kFloat).to(in));
      EXPECT_EQ(O.sizes(), at::IntArrayRef(shape)) << c.name;
      EXPECT_EQ(O.scalar_type(), c.dtype) << c.name << ": the output is in the compute dtype";
    }
  }
  EXPECT_THROW(run(c, at::randn({8})), c10::Error) << "a vector is not a matrix";
}

TEST_P(Ortho, BatchedEqualsPerMatrix) {
  const OrthoCase& c = GetParam();
  at::manual_seed(5);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{5, 32, 48}, {5, 48, 32}, {5, 40, 40}, {2, 3, 24, 40}, {3, 2, 40, 24}}) {
    const at::Tensor G = at::randn(shape);
    const at::Tensor batched = run(c, G);
    const at::Tensor flat = G.reshape({-1, G.size(-2), G.size(-1)});
    std::vector<at::Tensor> singles;
    for (int64_t i = 0; i < flat.size(0); ++i) singles.push_back(run(c, flat[i]));
    const at::Tensor each = at::stack(singles, 0).reshape(batched.sizes());
    const double d = max_abs_diff(batched, each);
    EXPECT_LE(d, batch_tolerance(c.dtype)) << c.name << " " << shape_str(shape);
    if (d > 0) std::printf("[ batch ] %s %s: max |diff| %.3g\n", c.name, shape_str(shape).c_str(), d);
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, Ortho, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------- configuration

TEST(OrthoConfig, FunctionDispatchesOnMethodAndDtype) {
  at::manual_seed(6);
  const at::Tensor G = at::randn({2, 24, 40});
  const dion::math::OrthoConfig pe{OrthoMethod::POLAR_EXPRESS, at::kFloat, {}};
  const dion::math::OrthoConfig ns{OrthoMethod::NEWTON_SCHULZ, at::kBFloat16, {}};
  EXPECT_TRUE(at::equal(pe.function()(G, 1e-6), dion::math::polar_express(G, 1e-6, at::kFloat)));
  EXPECT_TRUE(at::equal(ns.function()(G, 1e-7), dion::math::newton_schulz(G, 1e-7, at::kBFloat16)));
  EXPECT_FALSE(at::equal(pe.function()(G, 1e-6), dion::math::newton_schulz(G, 1e-6, at::kFloat)));
  // Default: Polar Express in bf16, the reference's default.
  const dion::math::OrthoConfig def;
  EXPECT_TRUE(at::equal(def.function()(G, 1e-6), dion::math::polar_express(G, 1e-6, at::kBFloat16)));
}

TEST(OrthoConfig, MethodNames) {
  for (OrthoMethod m : {OrthoMethod::POLAR_EXPRESS, OrthoMethod::NEWTON_SCHULZ})
    EXPECT_EQ(dion::math::ortho_method_from_string(dion::math::to_string(m)), m);
  try {
    dion::math::ortho_method_from_string("svd");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "'svd'", e.what());
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "polar_express", e.what());
  }
}

// A user-supplied orthogonalizer replaces the built-in one: the optimizer calls it once per
// megabatch (same-shape parameters stacked), passes the group's epsilon, and uses its result.
TEST(OrthoConfig, CustomFunctionIsCalledByTheOptimizer) {
  struct Call {
    std::vector<int64_t> shape;
    double epsilon;
  };
  std::vector<Call> calls;
  dion::math::OrthoConfig counting;
  counting.custom = [&calls](const at::Tensor& X, double eps) {
    calls.push_back({X.sizes().vec(), eps});
    return dion::math::polar_express(X, eps, at::kBFloat16);
  };

  at::manual_seed(7);
  auto make_params = [] {
    at::manual_seed(8);
    std::vector<at::Tensor> p = {at::randn({8, 16}), at::randn({8, 16}), at::randn({16, 8}), at::randn({16})};
    for (auto& t : p) t.mutable_grad() = at::randn_like(t);
    return p;
  };
  std::vector<at::Tensor> a = make_params(), b = make_params();
  auto groups = [](const std::vector<at::Tensor>& p) {
    return std::vector<dion::ParamGroup>{{{p[0], p[1], p[2]}, {.epsilon = 1e-5}}, {{p[3]}, {.algorithm = "adamw"}}};
  };
  dion::Muon custom(groups(a), dion::Muon::defaults(), counting);
  dion::Muon builtin(groups(b), dion::Muon::defaults());
  custom.step();
  builtin.step();
  ASSERT_EQ(calls.size(), 2u) << "one call per megabatch: [2, 8, 16] and [1, 16, 8]";
  EXPECT_EQ(calls[0].shape, (std::vector<int64_t>{2, 8, 16}));
  EXPECT_EQ(calls[1].shape, (std::vector<int64_t>{1, 16, 8}));
  EXPECT_EQ(calls[0].epsilon, 1e-5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "param " << i;

  // Dion2 goes through the same hook, with the selected rows only (k = ceil(0.25 * 8) = 2).
  calls.clear();
  std::vector<at::Tensor> c = make_params();
  dion::Dion2 dion2({{{c[0], c[1]}}}, dion::Dion2::defaults(), counting);
  dion2.step();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].shape, (std::vector<int64_t>{2, 2, 16}));

  // Its result is what gets applied: an orthogonalizer returning zeros leaves only the
  // weight decay, X *= 1 - lr * wd.
  dion::math::OrthoConfig zero;
  zero.custom = [](const at::Tensor& X, double) { return at::zeros_like(X); };
  std::vector<at::Tensor> d = make_params();
  const at::Tensor before = d[0].clone();
  dion::Muon zeroed({{{d[0]}}}, dion::Muon::defaults().lr(0.1).weight_decay(0.5), zero);
  zeroed.step();
  EXPECT_TRUE(at::equal(d[0], before * at::scalar_tensor(1.0f - 0.1f * 0.5f, at::kFloat)));
}

// ---------------------------------------------------------------------------- megabatch

TEST(OrthogonalizeMegabatch, SplitSizesEqualBlocksSeparatelyTimesScale) {
  at::manual_seed(9);
  const auto fn = dion::math::OrthoConfig{}.function();
  const at::Tensor X = at::randn({3, 40, 24}).to(at::kBFloat16);  // [N, m, n], fused Q|K|V rows
  const std::vector<int64_t> split = {16, 8, 16};
  const std::vector<double> scales = {0.5, 2.0, 1.5};
  for (bool with_scales : {false, true}) {
    const at::Tensor out =
        dion::math::orthogonalize_megabatch(X, fn, false, 1e-7, split, with_scales ? scales : std::vector<double>{});
    ASSERT_EQ(out.sizes(), X.sizes());
    std::vector<at::Tensor> blocks = X.split_with_sizes(split, -2);
    std::vector<at::Tensor> outs = out.split_with_sizes(split, -2);
    for (size_t i = 0; i < blocks.size(); ++i) {
      at::Tensor expected = fn(blocks[i], 1e-7);
      if (with_scales) expected = expected * scales[i];
      // Blocks 0 and 2 share one batched call: batched vs single tolerance (see above).
      EXPECT_LE(max_abs_diff(outs[i], expected), batch_tolerance(at::kBFloat16) * scales[i])
          << "block " << i << (with_scales ? " with scales" : "");
    }
    // Each block is orthogonal on its own (not the fused matrix): its singular values are ~scale.
    const at::Tensor sv = svdvals(outs[1]);
    const double s = with_scales ? scales[1] : 1.0;
    EXPECT_GE(sv.min().item<double>(), 0.83 * s);
    EXPECT_LE(sv.max().item<double>(), 1.17 * s);
  }
  EXPECT_THROW(dion::math::orthogonalize_megabatch(X, fn, false, 1e-7, {16, 16}), c10::Error)
      << "split sizes that do not sum to dim -2";
}

TEST(OrthogonalizeMegabatch, FlattenSemanticsFor4dParams) {
  // A megabatch of N = 2 conv weights [out=8, in=3, kh=2, kw=4]: X [2, 8, 3, 2, 4].
  at::manual_seed(10);
  std::vector<std::vector<int64_t>> shapes_seen;
  dion::math::OrthoFn fn = [&shapes_seen](const at::Tensor& X, double eps) {
    shapes_seen.push_back(X.sizes().vec());
    return dion::math::polar_express(X, eps, at::kFloat);
  };
  const at::Tensor X = at::randn({2, 8, 3, 2, 4});

  // flatten: each parameter is one [out, in*kh*kw] = [8, 24] matrix.
  const at::Tensor flat = dion::math::orthogonalize_megabatch(X, fn, true, 1e-7);
  EXPECT_EQ(shapes_seen.back(), (std::vector<int64_t>{2, 8, 24}));
  EXPECT_TRUE(at::equal(flat, dion::math::polar_express(X.reshape({2, 8, 24}), 1e-7, at::kFloat).reshape(X.sizes())));
  for (int64_t i = 0; i < 2; ++i) {  // each flattened parameter has 8 singular values ~1
    const at::Tensor sv = svdvals(flat[i].reshape({8, 24}));
    EXPECT_GE(sv.min().item<double>(), 0.83);
    EXPECT_LE(sv.max().item<double>(), 1.17);
  }

  // no flatten: the leading dims are a batch of [kh, kw] = [2, 4] matrices.
  const at::Tensor batched = dion::math::orthogonalize_megabatch(X, fn, false, 1e-7);
  EXPECT_EQ(shapes_seen.back(), (std::vector<int64_t>{48, 2, 4}));
  EXPECT_TRUE(
      at::equal(batched, dion::math::polar_express(X.reshape({48, 2, 4}), 1e-7, at::kFloat).reshape(X.sizes())));
  EXPECT_FALSE(at::allclose(flat, batched));

  // 2-D parameters (X 3-D): flatten changes nothing.
  const at::Tensor Y = at::randn({2, 8, 24});
  EXPECT_TRUE(at::equal(dion::math::orthogonalize_megabatch(Y, fn, true, 1e-7),
                        dion::math::orthogonalize_megabatch(Y, fn, false, 1e-7)));
}

// The same through the optimizer: a Muon step on a 4-D parameter with flatten = true applies
// adjusted_lr * orth(grad as [out, in*kh*kw]) with adjusted_lr = lr * sqrt(out / (in*kh*kw)).
TEST(OrthogonalizeMegabatch, FlattenThroughTheOptimizer) {
  at::manual_seed(11);
  for (bool flatten : {true, false}) {
    at::Tensor p = at::randn({8, 2, 3, 3});
    const at::Tensor p0 = p.clone(), g = at::randn_like(p);
    p.mutable_grad() = g.clone();
    dion::Muon opt({{{p}}}, dion::Muon::defaults().lr(0.05).weight_decay(0.0).flatten(flatten));
    opt.step();
    // First step: M = G; U = orth(M in bf16); X -= (adjusted_lr * U) formed in bf16.
    at::Tensor U;
    float adj = 0.05f;
    if (flatten) {
      U = dion::math::polar_express(g.to(at::kBFloat16).reshape({1, 8, 18}), 1e-8, at::kBFloat16).reshape(p.sizes());
      adj = 0.05f * static_cast<float>(std::sqrt(8.0 / 18.0));
    } else {
      U = dion::math::polar_express(g.to(at::kBFloat16).reshape({16, 3, 3}), 1e-8, at::kBFloat16).reshape(p.sizes());
    }
    const at::Tensor expected = p0 - U * at::scalar_tensor(adj, at::kFloat);
    EXPECT_TRUE(at::equal(p, expected)) << "flatten=" << flatten << " max |diff| " << max_abs_diff(p, expected);
  }
}

}  // namespace

// Legacy Dion's sharded sketch generator (FSDP x TP): the generator must live on the tensor's
// device — a CPU generator passed into a CUDA normal_ is refused ("Expected a 'cuda' device type
// for generator"), which is how the 2-D sharded path used to fail on GPUs. Here the CPU branch of
// the choice runs; tests/cuda/test_cuda.cpp runs the CUDA branch on a GPU machine.
TEST(DionSketch, GeneratorFollowsTheDeviceAndItsSeed) {
  at::Generator a = dion::math::dion_sketch_generator(at::Device(at::kCPU), 123);
  at::Generator b = dion::math::dion_sketch_generator(at::Device(at::kCPU), 123);
  EXPECT_EQ(a.device().type(), at::kCPU);
  EXPECT_EQ(a.current_seed(), 123u);
  // Same seed, same sketch: what makes every rank orthonormalize identically.
  at::Tensor P = at::randn({2, 300, 8});
  at::Tensor Pa = dion::math::dion_orthonormalize(P, 1.25f, a);
  at::Tensor Pb = dion::math::dion_orthonormalize(P, 1.25f, b);
  EXPECT_TRUE(at::equal(Pa, Pb));
  // Orthonormal columns (randomized Cholesky QR path: 300 rows > r = 8).
  at::Tensor gram = at::matmul(Pa.mT(), Pa);
  EXPECT_LE((gram - at::eye(8).expand_as(gram)).abs().max().item<double>(), 1e-4);
}
