// tests/train/model/test_kernels.cpp — the fast kernels (dion/train/kernels.h) against the exact ones.
//
// The one-pass loss kernel (src/train/model/cross_entropy_cpu.h) is checked against ATen's cross
// entropy over the same logits (bf16 ones cast to fp32: the reference's `logits.float()`): the
// loss within 1e-6 relative (fp32 sums of up to V = 1,031 terms in another order: ~sqrt(V) *
// 2^-24 = 2e-6 per row at worst, far less on the mean); the gradient, bf16: within one bf16
// rounding step (2^-8 relative: both round the same fp32 value, computed in another order, to
// bf16); fp32: within 1e-5 relative + 1e-9 absolute (ours is exp(x - m) * (scale / s), ATen's
// exp(x - m - log s) * scale: a few fp32 roundings and two sub-ULP exps apart, ~1e-6; a wrong
// term, a missing scale or a misplaced onehot moves an element by far more).
// The fast kind computes the same math in another order (oneDNN's GEMM blocking, the loss summed
// per chunk of rows, dW accumulated over chunks), so it is compared with a tolerance:
//   fp32: |fast - exact| <= 2e-5 * max|exact| (+1e-7 absolute for values near 0). Each output is
//   a sum of at most K = 1024 products here; reordering such a sum moves it by about
//   sqrt(K) * 2^-24 * max|term| (4e-6 relative, measured 1e-6 or below), so 2e-5 leaves a
//   margin of 5 and still fails on any wrong term (one misplaced row or a missing 1/N is >= 1e-3).
//   bf16 (autocast): the fast kind runs ATen's bf16 mm (oneDNN's bf16 GEMM, as at::linear) and
//   the bf16 loss kernel, whose gradient is rounded to bf16 before the loss's gradient scale is
//   applied (ATen's: after); 2e-2 of max|exact| allows that and another GEMM blocking (every
//   output rounded to bf16, 2^-8 = 3.9e-3 relative, a few roundings deep; measured 6.3e-3).
// The exact kind is ATen's own calls (at::linear, at::cross_entropy_loss), so the fast kind is
// also checked against the reference GPT's recorded loss (tests/vectors/train/gpt_reference.json).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "../../../src/train/model/cross_entropy_cpu.h"
#include "../../../src/train/model/transpose_cpu.h"
#include "../../../src/train/model/vec_exp.h"
#include "cpu_kind.h"
#include "dion/math/ortho.h"
#include "dion/train/autocast.h"
#include "dion/train/gpt.h"
#include "dion/train/kernels.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

double rel_diff(const at::Tensor& fast, const at::Tensor& exact) {
  const double scale = exact.abs().max().item<double>();
  return (fast.to(at::kFloat) - exact.to(at::kFloat)).abs().max().item<double>() / std::max(scale, 1e-30);
}

void expect_close(const at::Tensor& fast, const at::Tensor& exact, double tol, const char* what) {
  ASSERT_EQ(fast.sizes(), exact.sizes()) << what;
  const double d = rel_diff(fast, exact);
  EXPECT_LE(d, tol) << what << ": max |fast - exact| / max |exact| = " << d;
  std::printf("%-28s relative difference %.3g (tolerance %.1g)\n", what, d, tol);
}

TEST(TrainKernels, OneDnnLinearIsRegisteredInThisLibTorch) {
  // The fast kind falls back to at::mm without it; the wheels this project uses have it.
  EXPECT_TRUE(onednn_linear_available());
}

TEST(TrainKernels, MatmulEqualsAtenMmInEveryLayout) {
  at::manual_seed(1);
  const at::Tensor a = at::randn({64, 96}), b = at::randn({96, 80});
  expect_close(matmul_2d(a, b, Kernels::fast), at::mm(a, b), 2e-5, "a b");
  expect_close(matmul_2d(a.t().contiguous().t(), b, Kernels::fast), at::mm(a, b), 2e-5, "a (column-major) b");
  expect_close(matmul_2d(a, b.t().contiguous().t(), Kernels::fast), at::mm(a, b), 2e-5, "a b (column-major)");
  // Products whose row count varies (an expert's block of rows: oneDNN on rows rounded up to 32).
  // 45 rows followed by others in their storage, NaN among them (read, and their results dropped);
  // 30 rows at its end (a zero-padded copy); into a block of rows of a larger output.
  const at::Tensor rows = at::randn({100, 96});
  rows.narrow(0, 56, 8).fill_(std::numeric_limits<float>::quiet_NaN());
  const at::Tensor mid = rows.narrow(0, 10, 45), end = rows.narrow(0, 70, 30);
  expect_close(matmul_2d(mid, b, Kernels::fast, Shape::varies), at::mm(mid, b), 2e-5, "45 rows, shape varies");
  expect_close(matmul_2d(end, b, Kernels::fast, Shape::varies), at::mm(end, b), 2e-5, "30 last rows, shape varies");
  const at::Tensor out = at::full({70, 80}, 7.0);
  matmul_2d_out(out.narrow(0, 3, 45), mid, b, Kernels::fast, Shape::varies);
  expect_close(out.narrow(0, 3, 45), at::mm(mid, b), 2e-5, "45 rows into rows 3..48, shape varies");
  EXPECT_TRUE(at::equal(out.narrow(0, 0, 3), at::full({3, 80}, 7.0))) << "rows before the block kept";
  EXPECT_TRUE(at::equal(out.narrow(0, 48, 22), at::full({22, 80}, 7.0))) << "rows after the block kept";
  const at::Tensor rows16 = rows.to(at::kBFloat16), b16 = b.to(at::kBFloat16);  // bf16 rounds its rows too
  for (const auto& [r0, n] : {std::pair<int64_t, int64_t>{10, 45}, {70, 30}}) {
    const at::Tensor blk = rows16.narrow(0, r0, n);
    const at::Tensor got = matmul_2d(blk, b16, Kernels::fast, Shape::varies);
    EXPECT_EQ(got.sizes(), (std::vector<int64_t>{n, 80}));
    expect_close(got, at::mm(blk, b16), 2e-2, "bf16 rows, shape varies");
  }
  // A bf16 weight gradient over a varying block (X^T Y, the reduction over the rows): split into
  // the rows rounded down to 32 and the rest (77 = 64 + 13), or whole (20 rows; 64), NaN rows after
  // the block never read; into a block of a larger output.
  const at::Tensor xs16 = at::randn({100, 96}).to(at::kBFloat16), ys16 = at::randn({100, 80}).to(at::kBFloat16);
  xs16.narrow(0, 87, 13).fill_(std::numeric_limits<float>::quiet_NaN());
  ys16.narrow(0, 87, 13).fill_(std::numeric_limits<float>::quiet_NaN());
  for (const auto& [r0, n] : {std::pair<int64_t, int64_t>{10, 77}, {10, 20}, {0, 64}}) {
    SCOPED_TRACE("bf16 X^T Y over " + std::to_string(n) + " rows");
    const at::Tensor x = xs16.narrow(0, r0, n), y = ys16.narrow(0, r0, n);
    const at::Tensor want = at::mm(x.t().to(at::kFloat), y.to(at::kFloat));
    const at::Tensor got = matmul_2d(x.t(), y, Kernels::fast, Shape::varies);
    EXPECT_EQ(got.scalar_type(), at::kBFloat16);
    expect_close(got.to(at::kFloat), want, 2e-2, "bf16 X^T Y, shape varies");
    const at::Tensor dw = at::full({3, 96, 80}, 7.0).to(at::kBFloat16);
    matmul_2d_out(dw.select(0, 1), x.t(), y, Kernels::fast, Shape::varies);
    expect_close(dw.select(0, 1).to(at::kFloat), want, 2e-2, "bf16 X^T Y into a block, shape varies");
    EXPECT_TRUE(at::equal(dw.select(0, 0), at::full({96, 80}, 7.0).to(at::kBFloat16))) << "other blocks kept";
  }
  const at::Tensor ab = a.to(at::kBFloat16), bb = b.to(at::kBFloat16);
  const at::Tensor fb = matmul_2d(ab, bb, Kernels::fast);
  EXPECT_EQ(fb.scalar_type(), at::kBFloat16);
  expect_close(fb, at::mm(ab, bb), 2e-2, "bf16 a b");
  EXPECT_TRUE(at::equal(matmul_2d(a, b, Kernels::exact), at::mm(a, b)));
}

struct LinearGrads {
  at::Tensor y, dx, dw;
};
LinearGrads linear_grads(Kernels kind, bool autocast) {
  at::manual_seed(2);
  at::Tensor x = at::randn({3, 40, 64}).requires_grad_();
  at::Tensor w = (at::randn({48, 64}) * 0.1).requires_grad_();
  at::Tensor y;
  {
    AutocastScope ac(at::kCPU, autocast);
    y = linear(x, w, kind);
  }
  (y.to(at::kFloat) * at::linspace(-1, 1, 48)).sum().backward();
  return {y.detach(), x.grad(), w.grad()};
}

TEST(TrainKernels, FastLinearEqualsAtLinearForwardAndBackward) {
  for (bool autocast : {false, true}) {
    SCOPED_TRACE(autocast ? "bf16 autocast" : "fp32");
    const LinearGrads e = linear_grads(Kernels::exact, autocast), f = linear_grads(Kernels::fast, autocast);
    EXPECT_EQ(f.y.scalar_type(), e.y.scalar_type());  // bf16 under autocast, as at::linear
    EXPECT_EQ(f.dw.scalar_type(), at::kFloat);        // the parameter's dtype
    const double tol = autocast ? 2e-2 : 2e-5;
    expect_close(f.y, e.y, tol, autocast ? "linear y (bf16)" : "linear y");
    expect_close(f.dx, e.dx, tol, autocast ? "linear dx (bf16)" : "linear dx");
    expect_close(f.dw, e.dw, tol, autocast ? "linear dw (bf16)" : "linear dw");
  }
}

struct LossGrads {
  at::Tensor loss, dh, dw;
};
// N = 600 rows: two full chunks of 256 and a partial one; every 7th target ignored (-1).
LossGrads loss_grads(Kernels kind, bool autocast, double grad_scale) {
  at::manual_seed(3);
  at::Tensor h = at::randn({600, 32}).requires_grad_();
  at::Tensor w = (at::randn({1000, 32}) * 0.5).requires_grad_();
  at::Tensor t = at::randint(0, 1000, {600}, at::kLong);
  t.index_put_({at::arange(0, 600, 7)}, -1);
  at::Tensor loss;
  {
    AutocastScope ac(at::kCPU, autocast);
    loss = linear_cross_entropy(h, w, t, kind);
  }
  (loss * grad_scale).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

TEST(TrainKernels, FusedChunkedCrossEntropyEqualsLinearThenCrossEntropy) {
  for (bool autocast : {false, true}) {
    SCOPED_TRACE(autocast ? "bf16 autocast" : "fp32");
    const LossGrads e = loss_grads(Kernels::exact, autocast, 3.0), f = loss_grads(Kernels::fast, autocast, 3.0);
    EXPECT_EQ(f.loss.scalar_type(), at::kFloat);
    EXPECT_EQ(f.loss.dim(), 0);
    // fp32: chunked against whole-logits GEMMs, sums over V = 1000 and N = 600 in other orders;
    // 1.2e-6 (dh) and 7e-7 (dw) relative to the largest entry, run alone on an AMX Xeon, but once,
    // in a whole suite from a fresh clone on that Xeon (2026-12-06), 5.3e-5 and 4.1e-5 (not
    // reproduced alone; likely MKL's default branch, CBWR AUTO, which on that Xeon also rounds
    // sgemm differently from process to process: test_numerics.cpp).
    // 2e-4 holds that with room; a wrong chunk, scale or ignored row is off by >= 1e-2.
    const double tol = autocast ? 2e-2 : 2e-4;
    expect_close(f.loss, e.loss, autocast ? 1e-3 : 2e-6, autocast ? "loss (bf16 logits)" : "loss");
    expect_close(f.dh, e.dh, tol, autocast ? "dh (bf16)" : "dh");
    expect_close(f.dw, e.dw, tol, autocast ? "dw (bf16)" : "dw");
  }
}

TEST(TrainKernels, FusedCrossEntropyWithoutGradientsIsTheSameLoss) {
  at::manual_seed(4);
  const at::Tensor h = at::randn({300, 16}), w = at::randn({500, 16});
  const at::Tensor t = at::randint(0, 500, {300}, at::kLong);
  at::NoGradGuard no_grad;
  expect_close(linear_cross_entropy(h, w, t, Kernels::fast), linear_cross_entropy(h, w, t, Kernels::exact), 2e-6,
               "no-grad loss");
}

TEST(TrainKernels, AllTargetsIgnoredIsNanAsCrossEntropy) {
  const at::Tensor h = at::randn({4, 8}), w = at::randn({10, 8});
  const at::Tensor t = at::full({4}, -1, at::kLong);
  EXPECT_TRUE(std::isnan(linear_cross_entropy(h, w, t, Kernels::exact).item<double>()));
  EXPECT_TRUE(std::isnan(linear_cross_entropy(h, w, t, Kernels::fast).item<double>()));
  // The gradients: ignored rows contribute nothing, so zeros (as F.cross_entropy's); also with no
  // rows at all.
  for (int64_t rows : {4, 0})
    for (Kernels kind : {Kernels::exact, Kernels::fast}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + (kind == Kernels::fast ? ", fast" : ", exact"));
      const at::Tensor hg = at::randn({rows, 8}).requires_grad_(), wg = at::randn({10, 8}).requires_grad_();
      const at::Tensor loss = linear_cross_entropy(hg, wg, at::full({rows}, -1, at::kLong), kind);
      EXPECT_TRUE(std::isnan(loss.item<double>()));
      loss.backward();
      EXPECT_TRUE(at::equal(hg.grad(), at::zeros_like(hg))) << hg.grad();
      EXPECT_TRUE(at::equal(wg.grad(), at::zeros_like(wg))) << wg.grad();
    }
}

// Causal attention in bf16 (causal_attention, kernels.h). At T <= kAttentionUpcastMaxT the fast
// kind is ATen's fp32 flash attention over the operands rounded to bf16 (autocast's cast) and
// made fp32, its output rounded to bf16: the same ATen calls composed here, so the same bits,
// forward and gradients. It is closer to exact arithmetic than ATen's bf16 attention (scores, P
// and sums in fp32): against an fp64 evaluation its gradients' mean error is below the exact
// kind's (both round the gradients to bf16 at the end; the exact kind's P in bf16 adds to that). The exact kind, fp32 operands and
// longer sequences (where ATen's bf16 products are oneDNN's) are ATen's call itself.
struct AttentionGrads {
  at::Tensor y, dq, dk, dv;
};
AttentionGrads attention_grads(int64_t T, bool autocast,
                               const std::function<at::Tensor(at::Tensor, at::Tensor, at::Tensor)>& f) {
  at::manual_seed(5);
  at::Tensor q = at::randn({2, 3, T, 16}).requires_grad_(), k = at::randn({2, 3, T, 16}).requires_grad_();
  at::Tensor v = at::randn({2, 3, T, 16}).requires_grad_();
  at::Tensor y;
  {
    AutocastScope ac(at::kCPU, autocast);
    y = f(q, k, v);
  }
  (y.to(at::kDouble) * at::linspace(-1, 1, 16, at::kDouble)).sum().backward();
  return {y.detach(), q.grad(), k.grad(), v.grad()};
}
void expect_same_bits(const AttentionGrads& a, const AttentionGrads& b, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.y.scalar_type(), b.y.scalar_type());
  EXPECT_TRUE(at::equal(a.y, b.y));
  EXPECT_TRUE(at::equal(a.dq, b.dq));
  EXPECT_TRUE(at::equal(a.dk, b.dk));
  EXPECT_TRUE(at::equal(a.dv, b.dv));
}

TEST(TrainKernels, FastBf16AttentionIsFp32FlashOverTheBf16Operands) {
  auto kind = [](Kernels kd) {
    return [kd](at::Tensor q, at::Tensor k, at::Tensor v) { return causal_attention(q, k, v, kd); };
  };
  auto aten = [](at::Tensor q, at::Tensor k, at::Tensor v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  };
  auto upcast = [&](at::Tensor q, at::Tensor k, at::Tensor v) {
    auto up = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
    return aten(up(q), up(k), up(v)).to(at::kBFloat16);
  };
  const int64_t T = 40;
  ASSERT_TRUE(attention_upcasts(T));
  const AttentionGrads fast = attention_grads(T, true, kind(Kernels::fast));
  EXPECT_EQ(fast.y.scalar_type(), at::kBFloat16);  // as autocast's attention
  expect_same_bits(fast, attention_grads(T, false, upcast), "fast, bf16, T 40: the fp32 flash composition");
  const AttentionGrads exact = attention_grads(T, true, kind(Kernels::exact));
  expect_same_bits(exact, attention_grads(T, true, aten), "exact: ATen's call under autocast");
  // Against fp64 on the same bf16 operands: the fast kind's gradients are the closer ones.
  const AttentionGrads f64 = attention_grads(T, false, [](at::Tensor q, at::Tensor k, at::Tensor v) {
    auto up = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kDouble); };
    return at::scaled_dot_product_attention(up(q), up(k), up(v), {}, 0.0, true);
  });
  for (auto [name, pick] :
       {std::pair{"dq", &AttentionGrads::dq}, {"dk", &AttentionGrads::dk}, {"dv", &AttentionGrads::dv}}) {
    const double ef = (fast.*pick - f64.*pick).abs().mean().item<double>();
    const double ee = (exact.*pick - f64.*pick).abs().mean().item<double>();
    std::printf("attention %s: mean error against fp64: fast %.3g, exact (bf16 flash) %.3g\n", name, ef, ee);
    EXPECT_LT(ef, ee) << name;
    expect_close(fast.*pick, exact.*pick, 2e-2, name);
  }
  // fp32 operands without autocast, fp64 ones under it (autocast leaves fp64 alone): ATen's call.
  expect_same_bits(attention_grads(T, false, kind(Kernels::fast)), attention_grads(T, false, aten), "fp32");
  auto f64_operands = [](const std::function<at::Tensor(at::Tensor, at::Tensor, at::Tensor)>& f) {
    return [f](at::Tensor q, at::Tensor k, at::Tensor v) {
      return f(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble));
    };
  };
  const AttentionGrads fast64 = attention_grads(T, true, f64_operands(kind(Kernels::fast)));
  EXPECT_EQ(fast64.y.scalar_type(), at::kDouble);
  expect_same_bits(fast64, attention_grads(T, true, f64_operands(aten)), "fp64 under autocast");
  // Beyond kAttentionUpcastMaxT, where ATen's bf16 products are oneDNN's: ATen's bf16 call.
  const int64_t long_t = kAttentionUpcastMaxT + 1;
  EXPECT_EQ(attention_upcasts(long_t), !dion::math::aten_bf16_matmul_uses_onednn());
  if (!attention_upcasts(long_t))
    expect_same_bits(attention_grads(long_t, true, kind(Kernels::fast)), attention_grads(long_t, true, aten),
                     "fast, bf16, T 257");
}

TEST(TrainKernels, BadShapesNameThem) {
  const at::Tensor h = at::randn({4, 8}), w = at::randn({10, 9}), t = at::zeros({4}, at::kLong);
  try {
    linear_cross_entropy(h, w, t, Kernels::fast);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("h [N, C], w [V, C]"), std::string::npos) << e.what();
  }
}

TEST(TrainKernels, LossKernelRunsWhereTheCpuHasIt) {
  using dion::testing::cpu_flag;
  // ... and ATen runs its AVX-512 (AVX2) kernels: scripts/test_avx2.sh sets ATEN_CPU_CAPABILITY=avx2.
  const bool avx512 =
      cpu_flag("avx512f") && cpu_flag("avx512bw") && cpu_flag("avx512vl") && dion::testing::aten_avx512();
  const std::string cap = at::get_cpu_capability();
  const bool avx2 = cpu_flag("avx2") && cpu_flag("fma") && (cap == "AVX2" || cap == "AVX512");
  EXPECT_EQ(cross_entropy_inplace_available(at::kBFloat16), avx512);
  EXPECT_EQ(cross_entropy_inplace_available(at::kFloat), avx512 || avx2);
  EXPECT_FALSE(cross_entropy_inplace_available(at::kDouble));
  std::printf("the loss kernel: bf16 %s, fp32 %s (ATen's capability %s)\n", avx512 ? "AVX-512" : "no (ATen's loss)",
              avx512 ? "AVX-512" : (avx2 ? "AVX2" : "no (ATen's loss)"), cap.c_str());
}

// The chunked loss's last dW step (transpose_cpu.h): (a + b)^T bit for bit against ATen, on
// shapes with whole 16 x 16 tiles, edges in either dimension, several column blocks of 256, and
// none; a NaN and infinities pass through. Where the AVX-512 kernel does not run (ATen's
// capability below AVX512: the TrainKernels.aten_loss run of this suite, scripts/test_avx2.sh)
// this checks the fallback.
TEST(TrainKernels, TransposeSumEqualsAtenBitForBit) {
  using dion::testing::cpu_flag;
  EXPECT_EQ(transpose_sum_kernel_available(),
            cpu_flag("avx512f") && cpu_flag("avx512bw") && cpu_flag("avx512vl") && dion::testing::aten_avx512());
  at::manual_seed(11);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{16, 16}, {128, 1000}, {37, 45}, {3, 600}, {130, 17},
                                                           {1, 1}, {0, 9}, {9, 0}};
  for (const auto& [N, M] : shapes) {
    SCOPED_TRACE("a, b [" + std::to_string(N) + ", " + std::to_string(M) + "]");
    const at::Tensor a = at::randn({N, M}), b = at::randn({N, M}) * 1e3;
    if (N * M > 40) {
      a.view({-1})[7] = NAN;
      b.view({-1})[23] = INFINITY;
      a.view({-1})[39] = -INFINITY;
    }
    const at::Tensor out = at::full({M, N}, 5.0f);
    transpose_sum_into(out, a, b);
    const at::Tensor want = (a + b).t().contiguous();
    ASSERT_EQ(out.numel(), want.numel());
    EXPECT_EQ(std::memcmp(out.data_ptr<float>(), want.data_ptr<float>(), size_t(out.numel()) * sizeof(float)), 0);
  }
  EXPECT_THROW(transpose_sum_into(at::empty({4, 3}), at::empty({4, 3}), at::empty({4, 3})), c10::Error);
  EXPECT_THROW(transpose_sum_into(at::empty({3, 4}), at::empty({4, 3}), at::empty({3, 4}).t()), c10::Error);  // strided
}

// The loss kernel's exp (vec_exp.h) against double's exp: every 97th fp32 value in [-87, 88]
// (23 M values) and every 31st in [-103, -87], whose results are subnormal, within 1 ulp (of the
// result's binade; subnormals: of 2^-149); measured 0.92 and 0.84. The series without its r^7
// term was checked to fail (2.7 ulp). And the edges: 0 and inf beyond the clamps, NaN kept.
namespace {
double ulp_error(float got, double want) {
  if (want == 0) return got == 0 ? 0 : INFINITY;
  const double ulp = std::fabs(want) < 1.1754943508222875e-38 ? std::ldexp(1.0, -149)
                                                              : std::ldexp(1.0, std::ilogb(want) - 23);
  return std::fabs(double(got) - want) / ulp;
}

__attribute__((target("avx512f,fma"))) void exp16_of(const float* x, float* y) {
  _mm512_storeu_ps(y, exp16(_mm512_loadu_ps(x)));
}
__attribute__((target("avx2,fma"))) void exp8_of(const float* x, float* y) {
  _mm256_storeu_ps(y, exp8(_mm256_loadu_ps(x)));
  _mm256_storeu_ps(y + 8, exp8(_mm256_loadu_ps(x + 8)));
}

// The largest error over every `step`th fp32 value from lo to hi (lo < 0 < hi or lo < hi <= 0),
// 16 at a time: a walk over the bit patterns of each sign's magnitudes.
template <class F>
double max_exp_error(F&& exp_of, float lo, float hi, uint32_t step) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u & 0x7FFFFFFFu;
  };
  std::vector<float> xs;
  auto walk = [&](float from, float to, float sign) {  // magnitudes |from| .. |to|
    for (uint64_t u = bits(from); u <= bits(to); u += step) {
      uint32_t v = static_cast<uint32_t>(u);
      float f;
      std::memcpy(&f, &v, sizeof f);
      xs.push_back(sign * f);
    }
  };
  if (hi > 0) walk(0.0f, hi, 1.0f);
  walk(hi > 0 ? 0.0f : -hi, -lo, -1.0f);
  while (xs.size() % 16) xs.push_back(lo);
  double worst = 0;
  float out[16];
  for (size_t i = 0; i < xs.size(); i += 16) {
    exp_of(xs.data() + i, out);
    for (int j = 0; j < 16; ++j) worst = std::max(worst, ulp_error(out[j], std::exp(double(xs[i + size_t(j)]))));
  }
  return worst;
}
}  // namespace

TEST(TrainKernels, VectorExpIsWithinOneUlp) {
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx512 && !avx2) GTEST_SKIP() << "no AVX2 on this CPU: the loss kernel does not run";
  const float edges[16] = {-INFINITY, INFINITY, NAN, -200.f, 200.f, 0.f, -0.f, 88.72f,
                           -87.4f,    -103.9f,  -104.f, 1.f,  -1.f, 89.f,  100.f, -1e-30f};
  for (int wide = 0; wide < 2; ++wide) {
    if (wide ? !avx512 : !avx2) continue;
    SCOPED_TRACE(wide ? "exp16 (AVX-512)" : "exp8 (AVX2)");
    auto exp_of = [&](const float* x, float* y) { wide ? exp16_of(x, y) : exp8_of(x, y); };
    const double normal = max_exp_error(exp_of, -87.0f, 88.0f, 97), sub = max_exp_error(exp_of, -103.0f, -87.0f, 31);
    EXPECT_LE(normal, 1.0);
    EXPECT_LE(sub, 1.0);
    float y[16];
    exp_of(edges, y);
    EXPECT_EQ(y[0], 0.0f) << "exp(-inf)";
    EXPECT_EQ(y[1], INFINITY) << "exp(inf)";
    EXPECT_TRUE(std::isnan(y[2])) << "exp(nan)";
    EXPECT_EQ(y[3], 0.0f);
    EXPECT_EQ(y[4], INFINITY);
    EXPECT_EQ(y[5], 1.0f);
    EXPECT_EQ(y[6], 1.0f);
    EXPECT_LE(ulp_error(y[7], std::exp(double(edges[7]))), 1.0) << "near fp32's largest";
    EXPECT_GT(y[9], 0.0f) << "exp(-103.9) is the smallest subnormal";
    EXPECT_EQ(y[10], 0.0f);
    EXPECT_EQ(y[13], INFINITY);
    EXPECT_EQ(y[15], 1.0f);
    std::printf("%s: at most %.3f ulp over [-87, 88], %.3f where subnormal\n", wide ? "exp16" : "exp8", normal, sub);
  }
}

// V = 1031 (not a multiple of the 16 or 8 lanes), every 5th row ignored, logits around 0 and
// shifted by 60 (exp would overflow fp32 without the max).
class LossKernel : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(LossKernel, EqualsAtenCrossEntropyOverTheSameLogits) {
  const at::ScalarType dtype = GetParam();
  if (!cross_entropy_inplace_available(dtype)) GTEST_SKIP() << "no loss kernel for this dtype on this CPU";
  const bool bf16 = dtype == at::kBFloat16;
  for (double shift : {0.0, 60.0}) {
    SCOPED_TRACE("shift " + std::to_string(shift));
    at::manual_seed(7);
    const int64_t N = 45, V = 1031;
    const at::Tensor logits = (at::randn({N, V}) * 3 + shift).to(dtype);
    at::Tensor t = at::randint(0, V, {N}, at::kLong);
    t.index_put_({at::arange(0, N, 5)}, -1);
    const int64_t n_valid = t.ne(-1).sum().item<int64_t>();
    at::Tensor x = logits.to(at::kFloat).requires_grad_();
    at::Tensor ref = at::cross_entropy_loss(x, t, {}, at::Reduction::Mean, -1);
    ref.backward();
    const at::Tensor ref_grad = bf16 ? x.grad().to(at::kBFloat16).to(at::kFloat) : x.grad();

    at::Tensor ours = logits.clone();
    const double sum = cross_entropy_inplace(ours, t, -1, 1.0f / static_cast<float>(n_valid), true);
    const double loss = sum / static_cast<double>(n_valid);
    EXPECT_NEAR(loss, ref.item<double>(), 1e-6 * std::abs(ref.item<double>()));
    const at::Tensor g = ours.to(at::kFloat);
    const at::Tensor excess = bf16 ? (g - ref_grad).abs() - ref_grad.abs() * (1.0 / 256) - 1e-30
                                   : (g - ref_grad).abs() - ref_grad.abs() * 1e-5 - 1e-9;
    EXPECT_LE(excess.max().item<double>(), 0.0) << "further from ATen's gradient than the tolerance";
    EXPECT_TRUE(at::equal(g.index({at::arange(0, N, 5)}), at::zeros({(N + 4) / 5, V}))) << "ignored rows";
    std::printf("%s, shift %.0f: loss %.9g (ATen %.9g), gradient elements that differ: %lld of %lld\n",
                bf16 ? "bf16" : "fp32", shift, loss, ref.item<double>(),
                static_cast<long long>(g.ne(ref_grad).sum().item<int64_t>()), static_cast<long long>(g.numel()));

    at::Tensor no_grad = logits.clone();
    EXPECT_EQ(cross_entropy_inplace(no_grad, t, -1, 1.0f, false), sum) << "the loss without the gradient";
    EXPECT_TRUE(at::equal(no_grad, logits)) << "without the gradient the logits stay";
  }
}

TEST_P(LossKernel, IsTheSameForAnyThreadCount) {
  const at::ScalarType dtype = GetParam();
  if (!cross_entropy_inplace_available(dtype)) GTEST_SKIP() << "no loss kernel for this dtype on this CPU";
  at::manual_seed(8);
  const at::Tensor logits = at::randn({64, 300}).to(dtype);
  const at::Tensor t = at::randint(0, 300, {64}, at::kLong);
  const int threads = at::get_num_threads();
  at::Tensor a = logits.clone(), b = logits.clone();
  at::set_num_threads(1);
  const double la = cross_entropy_inplace(a, t, -1, 1.0f / 64, true);
  at::set_num_threads(2);
  const double lb = cross_entropy_inplace(b, t, -1, 1.0f / 64, true);
  at::set_num_threads(threads);
  EXPECT_EQ(la, lb);
  EXPECT_TRUE(at::equal(a, b));
}

// The unscaled form (row_factor; the lm_head's): diag(k) G' is the gradient the scaled form
// writes, to a rounding or two (fp32: k e vs k applied after, e - s at the target: within 4e-7
// relative + 1e-12 absolute; bf16: e rounded to bf16 and then scaled, against k e rounded, so
// within two bf16 roundings, 1/128 relative), and the loss is the same bits (the same m and s). A
// missing - s at the target or a row's k on another row is off by >= 1e-2 relative.
TEST_P(LossKernel, UnscaledGradientTimesRowFactorsIsTheGradient) {
  const at::ScalarType dtype = GetParam();
  if (!cross_entropy_inplace_available(dtype)) GTEST_SKIP() << "no loss kernel for this dtype on this CPU";
  const bool bf16 = dtype == at::kBFloat16;
  at::manual_seed(9);
  const int64_t N = 37, V = 1031;
  const at::Tensor logits = (at::randn({N, V}) * 3).to(dtype);
  at::Tensor t = at::randint(0, V, {N}, at::kLong);
  t.index_put_({at::arange(0, N, 4)}, -1);
  const float scale = 1.0f / static_cast<float>(t.ne(-1).sum().item<int64_t>());
  at::Tensor scaled = logits.clone(), unscaled = logits.clone(), k;
  const double l_scaled = cross_entropy_inplace(scaled, t, -1, scale, true);
  const double l_unscaled = cross_entropy_inplace(unscaled, t, -1, scale, true, &k);
  EXPECT_EQ(l_scaled, l_unscaled);
  if (bf16) {  // the portable conversion (AVX-512 without AVX512_BF16) gives the same bits here (no subnormals)
    at::Tensor portable = logits.clone(), k2;
    cross_entropy_force_portable_bf16(true);
    const double l_portable = cross_entropy_inplace(portable, t, -1, scale, true, &k2);
    cross_entropy_force_portable_bf16(false);
    EXPECT_EQ(l_portable, l_unscaled);
    EXPECT_TRUE(at::equal(k2, k));
    EXPECT_TRUE(at::equal(portable, unscaled)) << "the portable and the native bf16 conversion differ";
  }
  ASSERT_EQ(k.sizes(), at::IntArrayRef({N}));
  EXPECT_TRUE(at::equal(k.index({at::arange(0, N, 4)}), at::zeros({(N + 3) / 4}))) << "ignored rows' factors";
  EXPECT_TRUE(at::equal(unscaled.index({at::arange(0, N, 4)}), at::zeros({(N + 3) / 4, V}, dtype))) << "ignored rows";
  const at::Tensor g = unscaled.to(at::kFloat) * k.unsqueeze(1), ref = scaled.to(at::kFloat);
  const double excess = ((g - ref).abs() - ref.abs() * (bf16 ? 1.0 / 128 : 4e-7) - 1e-12).max().item<double>();
  EXPECT_LE(excess, 0.0) << "diag(k) G' is not the scaled kernel's gradient";
  EXPECT_LT(g.sum(1).abs().max().item<double>(), bf16 ? 1e-3 : 1e-6)
      << "each gradient row sums to 0 (softmax - onehot)";
  at::Tensor no_grad = logits.clone();
  EXPECT_THROW(cross_entropy_inplace(no_grad, t, -1, scale, false, &k), c10::Error) << "row_factor without grad";
}

TEST_P(LossKernel, NamesAnOutOfBoundsTarget) {
  const at::ScalarType dtype = GetParam();
  if (!cross_entropy_inplace_available(dtype)) GTEST_SKIP() << "no loss kernel for this dtype on this CPU";
  at::Tensor logits = at::zeros({3, 10}, dtype);
  const at::Tensor t = at::tensor(std::vector<int64_t>{1, 10, 2});
  try {
    cross_entropy_inplace(logits, t, -1, 1.0f, true);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 of row 1 is out of bounds (the vocabulary has 10 entries)"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(TrainKernels, LossKernel, ::testing::Values(at::kBFloat16, at::kFloat),
                         [](const auto& info) { return std::string(info.param == at::kFloat ? "fp32" : "bf16"); });

// bf16 operands without autocast (FSDP's bf16 gathers) take the bf16 kernel too; the gradients come
// back in the operands' dtype.
TEST(TrainKernels, Bf16OperandsLossEqualsAtenAndAllIgnoredIsNan) {
  at::manual_seed(9);
  const at::Tensor h = at::randn({40, 16}).to(at::kBFloat16).requires_grad_();
  const at::Tensor w = at::randn({200, 16}).to(at::kBFloat16).requires_grad_();
  const at::Tensor t = at::randint(0, 200, {40}, at::kLong);
  at::Tensor f = linear_cross_entropy(h, w, t, Kernels::fast);
  f.backward();
  const at::Tensor fdh = h.grad().clone(), fdw = w.grad().clone();
  h.mutable_grad().reset();
  w.mutable_grad().reset();
  at::Tensor e = linear_cross_entropy(h, w, t, Kernels::exact);
  e.backward();
  EXPECT_EQ(fdh.scalar_type(), at::kBFloat16);
  EXPECT_EQ(fdw.scalar_type(), at::kBFloat16);
  expect_close(f.detach(), e.detach(), 1e-3, "loss (bf16 operands)");
  expect_close(fdh, h.grad(), 2e-2, "dh (bf16 operands)");
  expect_close(fdw, w.grad(), 2e-2, "dw (bf16 operands)");
  at::NoGradGuard no_grad;
  EXPECT_TRUE(std::isnan(linear_cross_entropy(h, w, at::full({40}, -1, at::kLong), Kernels::fast).item<double>()));
}

// The whole GPT: fast against exact on every parameter's gradient, and against the reference's
// recorded loss (the exact kind's tolerance there is 2e-5 absolute, test_gpt.cpp).
TEST(TrainKernels, FastGptEqualsExactGptAndTheReferencesLoss) {
  std::ifstream f(test::source_dir() / "tests/vectors/train/gpt_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const auto& c = ref.at("config");
  GPTConfig cfg{c.at("sequence_len"), c.at("vocab_size"), c.at("n_layer"), c.at("n_head"), c.at("n_embd")};
  auto grads_of = [&](Kernels kind, double* loss) {
    GPTConfig k = cfg;
    k.kernels = kind;
    GPT model(k);
    at::manual_seed(ref.at("seed").get<uint64_t>());
    model->init_weights();
    const int64_t B = ref.at("batch").at("B"), T = ref.at("batch").at("T");
    at::Tensor tok =
        (at::arange(B, at::kLong).view({B, 1}) * 7919 + at::arange(T + 1, at::kLong).view({1, T + 1}) * 104729)
            .remainder(50257);
    at::Tensor l = model->loss(tok.slice(1, 0, T).contiguous(), tok.slice(1, 1).contiguous());
    l.backward();
    *loss = l.item<double>();
    std::vector<std::pair<std::string, at::Tensor>> g;
    for (const auto& item : model->named_parameters()) g.emplace_back(item.key(), item.value().grad());
    return g;
  };
  double loss_exact = 0, loss_fast = 0;
  const auto ge = grads_of(Kernels::exact, &loss_exact), gf = grads_of(Kernels::fast, &loss_fast);
  EXPECT_NEAR(loss_fast, ref.at("loss").get<double>(), 2e-5);
  EXPECT_NEAR(loss_fast, loss_exact, 2e-5);
  std::printf("loss fast %.9g exact %.9g reference %.9g\n", loss_fast, loss_exact, ref.at("loss").get<double>());
  ASSERT_EQ(ge.size(), gf.size());
  for (size_t i = 0; i < ge.size(); ++i) expect_close(gf[i].second, ge[i].second, 2e-5, ge[i].first.c_str());
}

}  // namespace
}  // namespace dion::train
