// tests/train/model/test_moe.cpp — the MoE feed-forward (dion/train/moe.h) in one process:
// routing against a dense computation written out token by token, the bias that only selects,
// the balancing step, the sequence-wise balance loss, and the parameter counts. The expert-
// parallel layouts against one process: tests/train/parallel/test_moe_parallel.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "dion/train/autocast.h"
#include "dion/train/gpt.h"
#include "dion/train/moe.h"

namespace dion::train {
namespace {

GPTConfig moe_config(int64_t E, int64_t K, int64_t shared, bool sigmoid = false, double aux = 0) {
  GPTConfig c{16, 64, 2, 2, 32};
  c.moe = MoEConfig{E, K, 24, shared, 1, sigmoid, aux};
  return c;
}

// The MoE's output computed one token at a time: sum over its top_k experts of the
// renormalised score times the expert's MLP, plus the shared MLP.
at::Tensor dense_reference(MoEImpl& m, const at::Tensor& x) {
  const int64_t C = x.size(-1), K = m.config().top_k;
  const at::Tensor xf = x.reshape({-1, C});
  const at::Tensor logits = at::linear(xf, m.router->weight).to(at::kFloat);
  const at::Tensor s = m.config().sigmoid ? logits.sigmoid() : logits.softmax(-1);
  const at::Tensor sel = std::get<1>(at::topk(s + m.expert_bias, K, -1));
  at::Tensor out = at::zeros_like(xf);
  for (int64_t t = 0; t < xf.size(0); ++t) {
    const at::Tensor w = s[t].index_select(0, sel[t]);
    const at::Tensor wn = w / w.sum();
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = sel[t][k].item<int64_t>();
      const at::Tensor h = at::relu(at::matmul(m.w1[e], xf[t])).square();
      out[t] += wn[k] * at::matmul(m.w2[e], h);
    }
  }
  out = out.view(x.sizes());
  if (m.shared) out = out + m.shared(x);
  return out;
}

TEST(TrainMoE, EveryTokenReachesItsTopKExpertsWeightedByItsRenormalisedScores) {
  for (bool sigmoid : {false, true})
    for (int64_t K : {1, 2, 3}) {
      at::manual_seed(5);
      GPT model(moe_config(4, K, K == 2 ? 1 : 0, sigmoid));
      model->init_weights();
      auto layers = model->moe_layers();
      ASSERT_EQ(layers.size(), 2u);
      MoEImpl& m = *layers[0];
      at::NoGradGuard no_grad;
      const at::Tensor x = at::randn({3, 7, 32});
      const at::Tensor got = m.forward(x);
      const at::Tensor want = dense_reference(m, x);
      // The same products summed in another order (grouped GEMMs vs one token): fp32 rounding.
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5))
          << "sigmoid " << sigmoid << " K " << K << " max diff " << (got - want).abs().max().item<double>();
      // Dropless: every token was routed K times (21 tokens).
      EXPECT_EQ(m.take_load().sum().item<int64_t>(), 21 * K);
      EXPECT_EQ(m.take_load().sum().item<int64_t>(), 0);  // take_load resets
      m.eval();  // validation's forwards are not the step's load
      (void)m.forward(x);
      EXPECT_EQ(m.take_load().sum().item<int64_t>(), 0);
      m.train();
    }
}

TEST(TrainMoE, TheBiasChoosesExpertsButDoesNotWeighThem) {
  at::manual_seed(1);
  GPT model(moe_config(4, 1, 0));
  model->init_weights();
  MoEImpl& m = *model->moe_layers()[0];
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({2, 5, 32});
  m.expert_bias.copy_(at::tensor({0.f, 0.f, 10.f, 0.f}));  // expert 2 wins every token
  (void)m.forward(x);
  const at::Tensor load = m.take_load();
  EXPECT_EQ(load[2].item<int64_t>(), 10) << load;
  // top_k 1: the renormalised weight is 1, so the output is expert 2's MLP whatever its score.
  const at::Tensor xf = x.reshape({-1, 32});
  const at::Tensor e2 = at::linear(at::relu(at::linear(xf, m.w1[2])).square(), m.w2[2]);
  EXPECT_TRUE(at::allclose(m.forward(x).reshape({-1, 32}), e2, 1e-5, 1e-5));
}

TEST(TrainMoE, TheBalancingStepLowersTheBiasOfOverloadedExpertsAndIsCentred) {
  at::manual_seed(1);
  GPT model(moe_config(4, 2, 0));
  model->init_weights();
  const at::Tensor load = at::tensor({40, 10, 10, 20}, at::kLong).repeat({2, 1});  // mean 20
  model->update_expert_bias(load, 0.01);
  const at::Tensor b = model->moe_layers()[1]->expert_bias;
  // sign(mean - load) = (-1, +1, +1, 0), minus its mean 0.25.
  EXPECT_TRUE(at::allclose(b, at::tensor({-0.0125f, 0.0075f, 0.0075f, -0.0025f}), 0, 1e-7)) << b;
  EXPECT_NEAR(b.sum().item<double>(), 0.0, 1e-7);
}

TEST(TrainMoE, TheSequenceWiseBalanceLossIsDeepSeekV3sAndOnlyWhileTraining) {
  at::manual_seed(3);
  GPT model(moe_config(4, 2, 0, /*sigmoid=*/true, /*aux=*/0.1));
  model->init_weights();
  MoEImpl& m = *model->moe_layers()[0];
  const at::Tensor x = at::randn({2, 6, 32});
  m.train();
  (void)m.forward(x);
  ASSERT_TRUE(m.aux_loss().defined());
  // By hand: per sequence, f_i = E / (K T) x tokens routed to i, P_i = mean of the normalised scores.
  at::NoGradGuard no_grad;
  const at::Tensor s = at::linear(x.reshape({-1, 32}), m.router->weight).sigmoid().view({2, 6, 4});
  const at::Tensor sel = std::get<1>(at::topk(s, 2, -1));
  double want = 0;
  for (int64_t b = 0; b < 2; ++b) {
    const at::Tensor P = (s[b] / s[b].sum(-1, true)).mean(0);
    const at::Tensor count = at::bincount(sel[b].reshape({-1}), {}, 4).to(at::kFloat);
    want += (count * (4.0 / (2 * 6)) * P).sum().item<double>() / 2;
  }
  EXPECT_NEAR(m.aux_loss().item<double>(), 0.1 * want, 1e-6);
  m.eval();
  (void)m.forward(x);
  EXPECT_FALSE(m.aux_loss().defined());
}

TEST(TrainMoE, ParameterCountsTotalAndActive) {
  GPTConfig c = moe_config(8, 2, 1);
  c.moe.every = 2;  // block 1 of 2 is MoE
  GPT model(c);
  int64_t n = 0;
  for (const at::Tensor& p : model->parameters()) n += p.numel();
  EXPECT_EQ(gpt_param_count(c), n);
  // Active: the routed experts of one token (2 of 8) instead of all.
  EXPECT_EQ(gpt_param_count(c) - gpt_active_param_count(c), (8 - 2) * 2 * 24 * 32);
  EXPECT_EQ(model->router_params().size(), 1u);
  GPTConfig dense{16, 64, 2, 2, 32};
  EXPECT_EQ(gpt_param_count(dense), gpt_active_param_count(dense));
}

// The grouped experts' own backward (moe.cpp GroupedExpertsFn) against autograd through the token-
// by-token computation: the gradients of the input, the router, both expert stacks and the shared
// expert, at both kernel kinds, with one expert that gets no token (its gradient is zero: no
// product touches it, so exactly zero). Tolerance 1e-5 relative and absolute: the reference
// multiplies other row counts, so its fp32 sums of up to 170 products round differently (a few
// 1e-7 relative; GEMM blocking differs by CPU); a missing or misplaced block of rows moves a
// gradient by far more.
TEST(TrainMoE, GradientsEqualTheTokenByTokenComputations) {
  for (Kernels kind : {Kernels::exact, Kernels::fast}) {
    at::manual_seed(7);
    GPTConfig c = moe_config(4, 2, 1);
    c.kernels = kind;
    GPT model(c);
    model->init_weights();
    MoEImpl& m = *model->moe_layers()[0];
    m.expert_bias.copy_(at::tensor({0.f, 0.f, 0.f, -10.f}));  // expert 3 gets no token
    const at::Tensor x0 = at::randn({3, 7, 32}), up = at::randn({3, 7, 32});
    const std::vector<at::Tensor> params = {m.router->weight, m.w1, m.w2, m.shared->c_fc->weight};
    auto grads = [&](bool reference) {
      const at::Tensor x = x0.clone().requires_grad_(true);
      for (const at::Tensor& p : params) p.mutable_grad() = at::Tensor();
      ((reference ? dense_reference(m, x) : m.forward(x)) * up).sum().backward();
      std::vector<at::Tensor> g = {x.grad()};
      for (const at::Tensor& p : params) g.push_back(p.grad().clone());
      return g;
    };
    const auto got = grads(false), want = grads(true);
    const char* names[] = {"x", "router", "w1", "w2", "shared c_fc"};
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-5))
          << names[i] << " kind " << int(kind) << " max diff " << (got[i] - want[i]).abs().max().item<double>();
    EXPECT_EQ(got[2][3].abs().max().item<double>(), 0.0);  // the idle expert
    EXPECT_EQ(got[3][3].abs().max().item<double>(), 0.0);
  }
}

// Under autocast the routed experts run as one node in bf16 (moe.cpp, grouped): the output and the
// gradients are the fp32 ones within bf16's rounding (8 bits of mantissa: 5% of the largest value,
// a margin over the ~1% seen). The bias fixes the experts chosen, so routing cannot flip on a
// near-tie between bf16 and fp32 router logits.
TEST(TrainMoE, UnderAutocastTheExpertsComputeInBf16AndEqualFp32WithinItsRounding) {
  at::manual_seed(11);
  GPTConfig c = moe_config(4, 2, 1);
  c.kernels = Kernels::fast;
  GPT model(c);
  model->init_weights();
  MoEImpl& m = *model->moe_layers()[0];
  m.expert_bias.copy_(at::tensor({0.f, 0.f, -10.f, -10.f}));  // experts 0 and 1 for every token
  const at::Tensor x0 = at::randn({3, 7, 32}), up = at::randn({3, 7, 32});
  auto run = [&](bool bf16) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    for (const at::Tensor& p : {m.w1, m.w2}) p.mutable_grad() = at::Tensor();
    at::Tensor y;
    {
      AutocastScope ac(at::kCPU, bf16);
      y = m.forward(x);
    }
    (y.to(at::kFloat) * up).sum().backward();
    return std::vector<at::Tensor>{y.detach().to(at::kFloat), x.grad(), m.w1.grad().clone(), m.w2.grad().clone()};
  };
  const auto got = run(true), want = run(false);
  const char* names[] = {"y", "x", "w1", "w2"};
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = want[i].abs().max().item<double>(), diff = (got[i] - want[i]).abs().max().item<double>();
    EXPECT_GT(scale, 0.0) << names[i];
    EXPECT_LE(diff, 0.05 * scale) << names[i] << ": max diff " << diff << " of max " << scale;
  }
  EXPECT_FALSE(at::equal(got[2], want[2])) << "the experts' weight gradient is bf16's, not fp32's";
}

TEST(TrainMoE, AGradientReachesTheRouterTheExpertsAndTheSharedExpert) {
  at::manual_seed(2);
  GPT model(moe_config(4, 2, 1));
  model->init_weights();
  const at::Tensor idx = at::randint(64, {2, 8}, at::kLong), tgt = at::randint(64, {2, 8}, at::kLong);
  model->loss(idx, tgt).backward();
  MoEImpl& m = *model->moe_layers()[0];
  for (const at::Tensor& p : {m.router->weight, m.w1, m.w2, m.shared->c_fc->weight}) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0);
  }
  EXPECT_FALSE(m.expert_bias.requires_grad());
}

}  // namespace
}  // namespace dion::train
