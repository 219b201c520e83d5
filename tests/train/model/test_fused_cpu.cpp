// tests/train/model/test_fused_cpu.cpp — the fast kind's one-pass rotary, relu^2 and RMSNorm
// (src/train/model/fused_cpu.h) against ATen's composition that the exact kind runs.
//
// The rotary and relu^2 do ATen's operations in ATen's order with ATen's roundings, so forward
// and gradients are compared bit for bit (the bytes), in fp32 and in bf16 (x and cos/sin bf16, as
// under autocast), over values that include zeros of both signs, negatives and a large range;
// and for 1 and 2 threads. A changed operation order, a fused multiply-add, a missed bf16
// rounding or a wrong sign moves some element by at least one ULP and fails.
// The RMSNorm sums a row's squares in another order than ATen's mean, so it is compared with a
// tolerance, relative to the largest element of the compared tensor:
//   fp32: 1e-5. The row's sum of C <= 256 positive squares in another order moves r by a few
//   2^-24 (~1e-7 relative); the gradient's sum of dy x has mixed signs, which can cancel, so the
//   bound is taken against the tensor's largest element (measured 1.7e-7 forward, 1e-8 gradient;
//   bf16 equal). A wrong eps (the test's first row of each batch is 1e-3 everywhere, where eps
//   matters), a missing 1/C or a dropped term moves elements by 1e-3 or more.
//   bf16: 2^-7. Both compute in fp32 and round once to bf16: values a few fp32 ULPs apart can
//   round to neighbouring bf16 values, one bf16 step (2^-8 relative, 2^-7 at a binade's edge).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <tuple>

#include "../../../src/train/model/fused_cpu.h"
#include "dion/train/gpt.h"

namespace dion::train {
namespace {

struct Grads {
  at::Tensor y, dx;
};

// Values of both signs over ~6 decades, with some exact zeros and negative zeros.
at::Tensor values(std::vector<int64_t> shape, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor v = at::randn(shape) * at::exp(at::randn(shape) * 3);
  v = at::where(at::rand(shape) < 0.05, at::zeros_like(v), v);
  v = at::where(at::rand(shape) < 0.05, at::full_like(v, -0.0), v);
  return v.to(dtype);
}

template <typename F>
Grads run(F f, const at::Tensor& x0, const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y = f(x);
  y.backward(dy);
  return {y.detach(), x.grad()};
}

// Bitwise: at::equal treats -0 == +0, so compare the bytes.
void expect_same_bits(const at::Tensor& a, const at::Tensor& b, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  const at::Tensor ai = a.contiguous().view(a.scalar_type() == at::kFloat ? at::kInt : at::kShort);
  const at::Tensor bi = b.contiguous().view(b.scalar_type() == at::kFloat ? at::kInt : at::kShort);
  const int64_t differ = ai.ne(bi).sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << a.numel() << " elements differ; max |a - b| "
                       << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class FusedCpu : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(FusedCpu, RotaryIsAtenCompositionBitForBit) {
  const at::ScalarType dtype = GetParam();
  const int64_t B = 3, T = 7, H = 2, D = 16;
  auto [cos, sin] = rotary_cos_sin(T, D, at::kCPU);  // bf16, as the model's
  const at::Tensor x = values({B, T, H, D}, dtype, 1), dy = values({B, T, H, D}, dtype, 2);
  ASSERT_TRUE(rotary_fused_available(x, cos));
  const Grads ref = run([&](const at::Tensor& v) { return apply_rotary(v, cos, sin); }, x, dy);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    const Grads got = run([&](const at::Tensor& v) { return rotary_fused(v, cos, sin); }, x, dy);
    expect_same_bits(got.y, ref.y, "rotary forward");
    expect_same_bits(got.dx, ref.dx, "rotary gradient");
  }
  at::set_num_threads(1);
}

TEST_P(FusedCpu, RotaryTakesAStridedInput) {  // q as the linear's [B, T, C] output viewed as heads
  const at::ScalarType dtype = GetParam();
  auto [cos, sin] = rotary_cos_sin(5, 8, at::kCPU);
  const at::Tensor x = values({2, 5, 4, 8}, dtype, 3).transpose(0, 2).contiguous().transpose(0, 2);
  ASSERT_FALSE(x.is_contiguous());
  const at::Tensor dy = values({2, 5, 4, 8}, dtype, 4);
  const Grads ref = run([&](const at::Tensor& v) { return apply_rotary(v, cos, sin); }, x, dy);
  const Grads got = run([&](const at::Tensor& v) { return rotary_fused(v, cos, sin); }, x, dy);
  expect_same_bits(got.y, ref.y, "rotary forward");
  expect_same_bits(got.dx, ref.dx, "rotary gradient");
}

TEST_P(FusedCpu, ReluSquareIsAtenCompositionBitForBit) {
  const at::ScalarType dtype = GetParam();
  const at::Tensor a = values({4, 33, 70}, dtype, 5), dy = values({4, 33, 70}, dtype, 6);
  const Grads ref = run([](const at::Tensor& v) { return at::relu(v).square(); }, a, dy);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    const Grads got = run([](const at::Tensor& v) { return relu_square_fused(v); }, a, dy);
    expect_same_bits(got.y, ref.y, "relu^2 forward");
    expect_same_bits(got.dx, ref.dx, "relu^2 gradient");
  }
  at::set_num_threads(1);
}

TEST_P(FusedCpu, RmsNormEqualsAtenToRounding) {
  const at::ScalarType dtype = GetParam();
  const double tol = dtype == at::kFloat ? 1e-5 : 1.0 / 128;
  for (int64_t C : {128, 37}) {  // a whole number of 16-lane blocks, and a tail
    at::Tensor x = values({3, 5, C}, dtype, 7);
    x.select(1, 0).fill_(1e-3);  // rows where eps matters: mean x^2 = 1e-6, eps 1.2e-7
    const at::Tensor dy = values({3, 5, C}, dtype, 8);
    const Grads ref = run([](const at::Tensor& v) { return at::rms_norm(v, {v.size(-1)}); }, x, dy);
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      const Grads got = run([](const at::Tensor& v) { return rms_norm_fused(v); }, x, dy);
      ASSERT_EQ(got.y.scalar_type(), dtype);
      for (auto [g, r, what] : {std::tuple{got.y, ref.y, "forward"}, std::tuple{got.dx, ref.dx, "gradient"}}) {
        const double scale = r.abs().max().item<double>();
        const double err = (g.to(at::kDouble) - r.to(at::kDouble)).abs().max().item<double>();
        EXPECT_LE(err, tol * scale) << "rms_norm " << what << ", C " << C << ", " << threads << " threads";
      }
    }
  }
  at::set_num_threads(1);
}

INSTANTIATE_TEST_SUITE_P(TrainKernels, FusedCpu, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return info.param == at::kFloat ? "fp32" : "bf16"; });

// The MoE's dispatch and combine: outputs and the rows' gradients are ATen's bits (the same
// products, each target's sum in row order); the weights' gradient is a dot product over C summed
// in another order than ATen's sum, so within 1e-6 of its largest element (37 products:
// ~sqrt(37) 2^-24 relative, measured below 1e-7; a wrong row or a missing term moves it by far more).
TEST(TrainKernels, MoeRowGatherAndScatterAreAtenComposition) {
  const int64_t R = 60, C = 37, N = 25;
  const at::Tensor x = values({N, C}, at::kFloat, 12), rows = values({R, C}, at::kFloat, 9);
  const at::Tensor dx = values({R, C}, at::kFloat, 13), dy = values({N, C}, at::kFloat, 10);
  at::manual_seed(11);
  const at::Tensor w = at::rand({R}), index = at::randint(N - 1, {R}, at::kLong);  // target N-1 gets none
  {
    const Grads ref = run([&](const at::Tensor& v) { return v.index_select(0, index); }, x, dx);
    const Grads got = run([&](const at::Tensor& v) { return gather_rows_fused(v, index); }, x, dx);
    expect_same_bits(got.y, ref.y, "gather forward");
    expect_same_bits(got.dx, ref.dx, "gather gradient");
  }
  auto combine = [&](bool fused) {
    at::Tensor r = rows.clone().requires_grad_(true), ww = w.clone().requires_grad_(true);
    at::Tensor y = fused ? weighted_scatter_rows_fused(r, ww, index, N)
                         : at::zeros({N, C}).index_add(0, index, r * ww.unsqueeze(1));
    y.backward(dy);
    return std::tuple{y.detach(), r.grad(), ww.grad()};
  };
  const auto [y0, dr0, dw0] = combine(false);
  const auto [y1, dr1, dw1] = combine(true);
  expect_same_bits(y1, y0, "combine forward");
  expect_same_bits(dr1, dr0, "combine rows' gradient");
  EXPECT_LE((dw1 - dw0).abs().max().item<double>(), 1e-6 * dw0.abs().max().item<double>())
      << "combine weights' gradient";
  // With the shared experts' output added in the same pass ([N, C] given as [1, N, C]): ATen's
  // combine then +, and plus's gradient dy; at 1 and 2 threads.
  const at::Tensor plus0 = values({1, N, C}, at::kFloat, 14);
  const int threads = at::get_num_threads();
  for (int nt : {1, 2}) {
    at::set_num_threads(nt);
    at::Tensor r = rows.clone().requires_grad_(true), ww = w.clone().requires_grad_(true);
    at::Tensor p0 = plus0.clone().requires_grad_(true), p1 = plus0.clone().requires_grad_(true);
    const at::Tensor want = at::zeros({N, C}).index_add(0, index, rows * w.unsqueeze(1)) + p0.view({N, C});
    const at::Tensor got = weighted_scatter_rows_fused(r, ww, index, N, p1);
    expect_same_bits(got.detach(), want.detach(), "combine + plus forward");
    want.backward(dy);
    got.backward(dy);
    expect_same_bits(p1.grad(), p0.grad(), "combine + plus: plus's gradient");
    expect_same_bits(r.grad(), dr0, "combine + plus: rows' gradient");
    const Grads g = run([&](const at::Tensor& v) { return gather_rows_fused(v, index); }, x, dx);
    const Grads g0 = run([&](const at::Tensor& v) { return v.index_select(0, index); }, x, dx);
    expect_same_bits(g.dx, g0.dx, "gather gradient at this thread count");
  }
  at::set_num_threads(threads);
  EXPECT_THROW(weighted_scatter_rows_fused(rows, w, index, N, at::zeros({N, C + 1})), c10::Error);
  EXPECT_THROW(weighted_scatter_rows_fused(rows, w, index + 1, N - 1), c10::Error);  // index N - 1 out of range
  EXPECT_THROW(gather_rows_fused(x.to(at::kDouble), index), c10::Error);
}

TEST(TrainKernels, FusedOpsNameWhatTheyTake) {
  EXPECT_FALSE(fused_available(at::zeros({2}, at::kDouble)));
  EXPECT_FALSE(fused_available(at::Tensor()));
  auto [cos, sin] = rotary_cos_sin(5, 8, at::kCPU);
  try {
    rotary_fused(at::zeros({2, 5, 4, 6}), cos, sin);
    FAIL() << "a head dim that does not match cos/sin was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cos/sin [T, D/2]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(rotary_fused_available(at::zeros({2, 5, 4, 8}, at::kBFloat16), cos.to(at::kFloat)));
  EXPECT_TRUE(rotary_fused_available(at::zeros({2, 5, 4, 8}), cos.to(at::kFloat)));
  EXPECT_THROW(rotary_fused(at::zeros({2, 5, 4, 8}, at::kBFloat16), cos.to(at::kFloat), sin.to(at::kFloat)),
               c10::Error);
  EXPECT_THROW(relu_square_fused(at::zeros({3}, at::kDouble)), c10::Error);
  EXPECT_THROW(rms_norm_fused(at::zeros({3}, at::kDouble)), c10::Error);
}

}  // namespace
}  // namespace dion::train
