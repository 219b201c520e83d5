// tests/train/model/test_router_cpu.cpp — the MoE router's one-pass kernel and the grouping by
// expert (src/train/model/router_cpu.h) against ATen's composition that the exact kind runs, with
// softmax and with sigmoid scores.
//
// Tolerances, relative to the compared tensor's largest element:
//   scores and weights: 1e-6. Both exps are within 1 ULP (the kernel's is Sleef's on AVX2 CPUs,
//   libm's elsewhere); softmax's row sum of E <= 16 positive terms runs in another order and its
//   normalization multiplies by 1/s; sigmoid's 1 / (1 + exp(-l)) rounds twice more: a few 2^-24
//   (~6e-8) each; measured (softmax) below 3e-7. A wrong max shift, a missing renormalization or
//   a bias in the weights moves them by 1e-2 or more.
//   gradients: 1e-5. Sums of up to E + K products of mixed signs, which cancel, bounded against
//   the largest element; measured (softmax) below 3e-7. A missing term of the renormalization's
//   backward (the - sum_k dw_k w_k), of softmax's or of sigmoid's (1 - p) moves elements by more
//   than 1e-2.
//   selection: equal on every token whose K-th and (K+1)-th biased scores are more than 1e-5
//   apart (the scores' own error is below 1e-6, so those cannot swap); the test checks that
//   nearly all tokens qualify.
//   grouping: bit for bit (integers).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <string>

#include "../../../src/train/model/router_cpu.h"

namespace dion::train {
namespace {

struct Result {
  at::Tensor scores, sel, w, dlogits;
};

// gs, gw: the gradients fed to scores and w (gs undefined: no balance loss path).
Result run(bool fused, const at::Tensor& logits0, const at::Tensor& bias, int64_t K, const at::Tensor& gs,
           const at::Tensor& gw, bool sigmoid = false) {
  at::Tensor logits = logits0.clone().requires_grad_(true);
  at::Tensor scores, sel, w;
  if (fused) {
    Routing r = route_topk_fused(logits, bias, K, sigmoid);
    scores = r.scores, sel = r.sel, w = r.w;
  } else {  // moe.cpp's exact kind
    scores = sigmoid ? logits.sigmoid() : logits.softmax(-1);
    sel = std::get<1>(at::topk(scores.detach() + bias, K, -1, true, true));
    w = scores.gather(1, sel);
    w = w / w.sum(-1, true);
  }
  at::Tensor loss = (w * gw).sum();
  if (gs.defined()) loss = loss + (scores * gs).sum();
  loss.backward();
  return {scores.detach(), sel, w.detach(), logits.grad()};
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-30);
}

TEST(TrainRouter, EqualsAtenScoresTopkAndRenormalizationWithGradients) {
  struct Case {
    int64_t N, E, K;
    bool with_scores_grad, with_bias;
  };
  for (bool sigmoid : {false, true})
    for (const Case c : {Case{700, 8, 2, true, true}, Case{700, 8, 2, false, false}, Case{333, 16, 4, true, true},
                         Case{64, 3, 3, true, false}, Case{50, 1, 1, true, true}, Case{200, 8, 1, true, true}}) {
      const std::string what = std::string(sigmoid ? "sigmoid" : "softmax") + " N " + std::to_string(c.N) + " E " +
                               std::to_string(c.E) + " K " + std::to_string(c.K);
      at::manual_seed(c.N + c.E);
      const at::Tensor logits = at::randn({c.N, c.E}) * 2;
      const at::Tensor bias = c.with_bias ? at::randn({c.E}) * 0.05 : at::zeros({c.E});
      const at::Tensor gs = c.with_scores_grad ? at::randn({c.N, c.E}) : at::Tensor();
      const at::Tensor gw = at::randn({c.N, c.K});
      const Result want = run(false, logits, bias, c.K, gs, gw, sigmoid);
      const Result got = run(true, logits, bias, c.K, gs, gw, sigmoid);
      EXPECT_LE(rel_err(got.scores, want.scores), 1e-6) << what;
      // Tokens whose selection cannot swap by rounding: the K-th and (K+1)-th biased scores apart.
      const at::Tensor sorted = std::get<0>(at::sort(want.scores + bias, -1, /*descending=*/true));
      const at::Tensor clear =
          c.K < c.E ? (sorted.select(1, c.K - 1) - sorted.select(1, c.K)).gt(1e-5) : at::ones({c.N}, at::kBool);
      EXPECT_GE(clear.sum().item<int64_t>(), c.N * 95 / 100) << what << ": too few tokens to compare";
      const at::Tensor rows = clear.nonzero().squeeze(1);
      EXPECT_TRUE(at::equal(got.sel.index_select(0, rows), want.sel.index_select(0, rows))) << what;
      EXPECT_LE(rel_err(got.w.index_select(0, rows), want.w.index_select(0, rows)), 1e-6) << what;
      EXPECT_LE(rel_err(got.dlogits.index_select(0, rows), want.dlogits.index_select(0, rows)), 1e-5) << what;
      // The weights sum to 1 per token and the bias only selects.
      EXPECT_LE((got.w.sum(1) - 1).abs().max().item<double>(), 1e-6) << what;
    }
}

TEST(TrainRouter, TheBiasSelectsWithoutWeighing) {
  // Two experts of equal score: the bias picks the second; its weight is its unbiased score.
  const at::Tensor logits = at::tensor({0.0f, 0.0f, -3.0f}).view({1, 3});
  const at::Tensor bias = at::tensor({0.0f, 0.5f, 0.0f});
  const Routing r = route_topk_fused(logits, bias, 1);
  EXPECT_EQ(r.sel.item<int64_t>(), 1);
  EXPECT_FLOAT_EQ(r.w.item<float>(), 1.0f);  // renormalized over the one chosen
  const Routing two = route_topk_fused(logits, at::Tensor(), 2);
  EXPECT_EQ(two.sel[0][0].item<int64_t>(), 0);  // a tie keeps the lower expert first
  EXPECT_EQ(two.sel[0][1].item<int64_t>(), 1);
  EXPECT_FLOAT_EQ(two.w[0][0].item<float>(), 0.5f);
}

TEST(TrainRouter, AnyThreadCountGivesTheSameBits) {
  at::manual_seed(3);
  const at::Tensor logits = at::randn({2000, 8}), gs = at::randn({2000, 8}), gw = at::randn({2000, 2});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = run(true, logits, at::zeros({8}), 2, gs, gw);
  at::set_num_threads(2);
  const Result two = run(true, logits, at::zeros({8}), 2, gs, gw);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one.scores, two.scores));
  EXPECT_TRUE(at::equal(one.sel, two.sel));
  EXPECT_TRUE(at::equal(one.w, two.w));
  EXPECT_TRUE(at::equal(one.dlogits, two.dlogits));
}

TEST(TrainRouter, GroupingIsTheStableArgsortAndTheCounts) {
  at::manual_seed(8);
  for (int64_t K : {1, 2, 3}) {
    const int64_t E = 7;
    at::Tensor sel = at::randint(E - 1, {301, K}, at::kLong);  // expert E-1 gets no rows
    const Grouping g = group_by_expert(sel, E);
    const at::Tensor want = at::argsort(sel.reshape({-1}), /*stable=*/true, 0);
    EXPECT_TRUE(at::equal(g.order, want)) << "K " << K;
    EXPECT_TRUE(at::equal(g.token, at::div(want, K, "floor"))) << "K " << K;
    const at::Tensor counts = at::bincount(sel.reshape({-1}), {}, E);
    ASSERT_EQ(int64_t(g.counts.size()), E);
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(g.counts[size_t(e)], counts[e].item<int64_t>()) << "K " << K;
  }
  const Grouping none = group_by_expert(at::zeros({0, 2}, at::kLong), 4);
  EXPECT_EQ(none.order.numel(), 0);
  EXPECT_EQ(none.counts, std::vector<int64_t>(4, 0));
  EXPECT_THROW(group_by_expert(at::full({2, 2}, 4, at::kLong), 4), c10::Error);  // expert 4 of 4
}

TEST(TrainRouter, RefusesWhatItDoesNotTake) {
  EXPECT_FALSE(router_fused_available(at::randn({4, 8}).to(at::kDouble), 2));
  EXPECT_FALSE(router_fused_available(at::randn({4, 8}), 9));
  EXPECT_FALSE(router_fused_available(at::randn({4, 8}), 0));
  EXPECT_THROW(route_topk_fused(at::randn({4, 8}), at::Tensor(), 9), c10::Error);
  EXPECT_THROW(route_topk_fused(at::randn({4, 8}), at::zeros({7}), 2), c10::Error);
}

}  // namespace
}  // namespace dion::train
