// QK-clip (dion/math/qk_clip.h, dion/optim/qk_clip.h): after apply(), every head whose largest
// logit was above tau gives exactly tau on the same inputs (to float64 rounding), the others are
// untouched bit for bit; a rank's shard (contiguous or strided rows) is scaled as the same rows of
// the whole weight; the maxima are combined over the ranks; bad input throws and scales nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "dion/dion.h"
#include "dion/math/qk_clip.h"

namespace {

constexpr int64_t kIn = 16, kHd = 4, kT = 12;

// The largest logit q_h . k_{h / g} / sqrt(hd) per query head over causal positions of x [T, in].
at::Tensor max_logits(const at::Tensor& wq, const at::Tensor& wk, const at::Tensor& x, int64_t H, int64_t Hkv) {
  at::Tensor q = at::matmul(x, wq.t()).view({kT, H, kHd}).transpose(0, 1);      // [H, T, hd]
  at::Tensor k = at::matmul(x, wk.t()).view({kT, Hkv, kHd}).transpose(0, 1);    // [Hkv, T, hd]
  k = k.repeat_interleave(H / Hkv, 0);
  at::Tensor s = at::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(kHd));  // [H, T, T]
  s = s.masked_fill(at::ones({kT, kT}, at::kBool).triu(1), -std::numeric_limits<double>::infinity());
  return std::get<0>(s.flatten(1).max(1));
}

struct Attn {
  at::Tensor wq, wk, x;
  int64_t H, Hkv;
};

Attn make(int64_t H, int64_t Hkv, uint64_t seed) {
  at::manual_seed(seed);
  Attn a{at::randn({H * kHd, kIn}, at::kDouble), at::randn({Hkv * kHd, kIn}, at::kDouble),
         at::randn({kT, kIn}, at::kDouble), H, Hkv};
  return a;
}

dion::QkClipLayer layer(const Attn& a) { return {"attn", a.wq, a.wk, {}, {}, a.H, a.Hkv, kHd}; }

TEST(QkClipMath, FactorsAreTauOverTheMaxAboveTauAndOneElsewhere) {
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor g = dion::math::qk_clip_factors(at::tensor({5.0, 20.0, 10.0, -inf}, at::kDouble), 10.0);
  EXPECT_TRUE(at::equal(g, at::tensor({1.0, 0.5, 1.0, 1.0}, at::kDouble))) << g;
}

TEST(QkClip, MhaHeadsAboveTauEndAtTauTheOthersUntouched) {
  Attn a = make(4, 4, 1);
  const at::Tensor before = max_logits(a.wq, a.wk, a.x, 4, 4);
  const double tau = before.median().item<double>();  // about half the heads clipped
  const at::Tensor wq0 = a.wq.clone(), wk0 = a.wk.clone();
  dion::QkClip clip(tau, {layer(a)});
  at::Tensor S = clip.apply({before.to(at::kFloat)});
  EXPECT_TRUE(at::equal(S[0], before.to(at::kFloat)));
  const at::Tensor after = max_logits(a.wq, a.wk, a.x, 4, 4);
  int64_t clipped = 0;
  for (int64_t h = 0; h < 4; ++h) {
    const double b = before[h].item<double>();
    at::Tensor q = a.wq.narrow(0, h * kHd, kHd), k = a.wk.narrow(0, h * kHd, kHd);
    if (static_cast<float>(b) > tau) {
      ++clipped;  // float32 maxima: tau / S off by float rounding, so the new max is tau to ~1e-7
      EXPECT_NEAR(after[h].item<double>(), tau, 1e-6 * tau) << "head " << h;
    } else {
      EXPECT_TRUE(at::equal(q, wq0.narrow(0, h * kHd, kHd)) && at::equal(k, wk0.narrow(0, h * kHd, kHd))) << h;
    }
  }
  EXPECT_GE(clipped, 1);
  EXPECT_LT(clipped, 4);
}

TEST(QkClip, GqaScalesOnlyTheQueryHeadsAndKeepsTheSharedKeys) {
  Attn a = make(4, 2, 2);
  const at::Tensor before = max_logits(a.wq, a.wk, a.x, 4, 2);
  const double tau = before.min().item<double>() * 0.5 + before.max().item<double>() * 0.5;
  const at::Tensor wk0 = a.wk.clone();
  dion::QkClip(tau, {layer(a)}).apply({before});
  EXPECT_TRUE(at::equal(a.wk, wk0));
  const at::Tensor after = max_logits(a.wq, a.wk, a.x, 4, 2);
  for (int64_t h = 0; h < 4; ++h) {
    const double b = before[h].item<double>();
    EXPECT_NEAR(after[h].item<double>(), std::min(b, tau), 1e-6 * std::abs(b)) << "head " << h;
  }
}

TEST(QkClip, ShardsAndStridedRowsScaleAsTheWholeWeight) {
  Attn whole = make(4, 4, 3);
  const at::Tensor S = max_logits(whole.wq, whole.wk, whole.x, 4, 4).to(at::kFloat);
  const double tau = S.median().item<double>();
  Attn parts{whole.wq.clone(), whole.wk.clone(), whole.x, 4, 4};
  dion::QkClip(tau, {layer(whole)}).apply({S});
  // Rank r of 2 holds rows r, r + 2, ... of wq (a strided shard) and rows [8r, 8r + 8) of wk.
  for (int64_t r = 0; r < 2; ++r) {
    at::Tensor qrows = at::arange(r, 4 * kHd, 2, at::kLong), krows = at::arange(8 * r, 8 * r + 8, at::kLong);
    at::Tensor q = parts.wq.index_select(0, qrows), k = parts.wk.index_select(0, krows);
    dion::QkClip(tau, {{"attn", q, k, qrows, krows, 4, 4, kHd}}).apply({S});
    EXPECT_TRUE(at::equal(q, whole.wq.index_select(0, qrows))) << "rank " << r;
    EXPECT_TRUE(at::equal(k, whole.wk.index_select(0, krows))) << "rank " << r;
  }
}

// A group of W ranks where the others' maxima are given: all_gather stacks them with this rank's.
class FakeGroup : public dion::AxisGroup {
 public:
  explicit FakeGroup(std::vector<at::Tensor> others) : others_(std::move(others)) {}
  int size() const override { return static_cast<int>(others_.size()) + 1; }
  int rank() const override { return 0; }
  std::string name() const override { return "fake"; }
  c10::Device control_device() const override { return c10::Device(c10::kCPU); }
  void all_reduce_(at::Tensor&) override { ADD_FAILURE() << "QK-clip's one collective is an all_gather"; }
  at::Tensor all_gather(const at::Tensor& x) override {
    ++calls;
    std::vector<at::Tensor> all{x};
    for (const at::Tensor& o : others_) all.push_back(o.view_as(x));
    return at::stack(all);
  }
  at::Tensor all_to_all(const at::Tensor& x) override { return x; }
  int calls = 0;

 private:
  std::vector<at::Tensor> others_;
};

TEST(QkClip, TheMaximaOfEveryLayerAreCombinedOverTheRanksInOneCollective) {
  Attn a = make(4, 4, 4), b = make(2, 1, 5);
  const float ninf = -std::numeric_limits<float>::infinity();
  // Layers of 4 and 2 heads, packed as [2, 4]: the other rank saw larger logits on some heads.
  auto group = std::make_shared<FakeGroup>(std::vector<at::Tensor>{at::tensor({1.f, 30.f, 2.f, 3.f, 40.f, 1.f, ninf, ninf})});
  dion::QkClip clip(20.0, {layer(a), layer(b)}, group);
  at::Tensor S = clip.apply({at::tensor({25.f, 5.f, ninf, 3.f}), at::tensor({2.f, 2.f})});
  EXPECT_EQ(group->calls, 1);
  EXPECT_TRUE(at::equal(S, at::tensor({25.f, 30.f, 2.f, 3.f, 40.f, 2.f, ninf, ninf}).view({2, 4}))) << S;
}

TEST(QkClip, BadInputThrowsAndScalesNothing) {
  Attn a = make(4, 4, 6);
  const at::Tensor wq0 = a.wq.clone();
  EXPECT_THROW(dion::QkClip(0.0, {layer(a)}), dion::ValueError);
  EXPECT_THROW(dion::QkClip(std::nan(""), {layer(a)}), dion::ValueError);
  EXPECT_THROW(dion::QkClip(10.0, {{"attn", a.wq, a.wk, {}, {}, 4, 3, kHd}}), dion::ValueError);  // 3 does not divide 4
  EXPECT_THROW(dion::QkClip(10.0, {{"attn", a.wq.narrow(0, 0, 8), a.wk, {}, {}, 4, 4, kHd}}), dion::ValueError);
  EXPECT_THROW(dion::QkClip(10.0, {{"attn", a.wq.narrow(0, 0, 8), a.wk, at::arange(10, 18, at::kLong), {}, 4, 4, kHd}}),
               dion::ValueError);  // rows past the 16 of 4 heads
  dion::QkClip clip(1e-3, {layer(a)});
  EXPECT_THROW(clip.apply({at::ones({3})}), dion::ValueError);
  EXPECT_THROW(clip.apply({}), dion::ValueError);
  try {
    clip.apply({at::tensor({1.f, std::nanf(""), 1.f, 1.f})});
    ADD_FAILURE() << "a NaN maximum was taken";
  } catch (const dion::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'attn' head 1"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(a.wq, wq0));
}

TEST(QkClip, ScalesParametersThatRequireGradInPlace) {
  at::Tensor wq = at::randn({8, kIn}).set_requires_grad(true), wk = at::randn({8, kIn}).set_requires_grad(true);
  dion::QkClip clip(1.0, {{"attn", wq, wk, {}, {}, 2, 2, kHd}});
  const at::Tensor q0 = wq.detach().clone();
  clip.apply({at::tensor({4.f, 0.5f})});
  EXPECT_TRUE(at::allclose(wq.detach().narrow(0, 0, kHd), q0.narrow(0, 0, kHd) * 0.5));
  EXPECT_TRUE(at::equal(wq.detach().narrow(0, kHd, kHd), q0.narrow(0, kHd, kHd)));
}

}  // namespace
