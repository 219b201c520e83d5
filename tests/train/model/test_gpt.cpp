// tests/train/model/test_gpt.cpp — our GPT against the reference's (models/gpt_model.py).
//
// tests/vectors/train/gpt_reference.json was written by tests/train/make_gpt_reference.py with the
// reference's own model (torch 2.11 CPU, fp32): the reference's init under torch.manual_seed,
// the first values of every parameter, and the loss on a fixed batch. We build the same model
// under the same seed and check:
//   - every parameter's first 4 values are EQUAL (same generator, same draws, same order);
//   - the loss equals the reference's within 2e-5 absolute (about 20 fp32 ulps at 11-16:
//     the same ATen kernels run, but matmul blocking in a Python vs C++ process may sum in a
//     different order; measured difference below);
//   - also after scaling every weight by 3 (a less uniform softmax, a stronger check).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dion/train/gpt.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

nlohmann::json load_reference() {
  std::ifstream f(test::source_dir() / "tests/vectors/train/gpt_reference.json");
  return nlohmann::json::parse(f);
}

std::pair<at::Tensor, at::Tensor> fixed_batch(int64_t B, int64_t T) {
  at::Tensor b = at::arange(B, at::kLong).view({B, 1});
  at::Tensor t = at::arange(T + 1, at::kLong).view({1, T + 1});
  at::Tensor tok = (b * 7919 + t * 104729).remainder(50257);
  return {tok.slice(1, 0, T).contiguous(), tok.slice(1, 1).contiguous()};
}

TEST(TrainGpt, SameSeedSameWeightsSameLossAsTheReference) {
  const nlohmann::json ref = load_reference();
  const auto& c = ref.at("config");
  GPT model(GPTConfig{c.at("sequence_len"), c.at("vocab_size"), c.at("n_layer"), c.at("n_head"), c.at("n_embd")});
  at::manual_seed(ref.at("seed").get<uint64_t>());
  model->init_weights();
  for (const auto& item : model->named_parameters()) {
    SCOPED_TRACE(item.key());
    const auto& first = ref.at("first_values").at(item.key());
    at::Tensor flat = item.value().detach().flatten();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(flat[int64_t(i)].item<float>(), first[i].get<float>());
  }
  auto [x, y] = fixed_batch(ref.at("batch").at("B"), ref.at("batch").at("T"));
  at::NoGradGuard no_grad;
  const double loss = model->loss(x, y).item<double>();
  EXPECT_NEAR(loss, ref.at("loss").get<double>(), 2e-5);
  for (at::Tensor p : model->parameters()) p.mul_(3.0);
  const double loss3 = model->loss(x, y).item<double>();
  EXPECT_NEAR(loss3, ref.at("loss_weights_x3").get<double>(), 2e-5);
  std::printf("loss %.9g (reference %.9g), weights x3: %.9g (reference %.9g)\n", loss, ref.at("loss").get<double>(),
              loss3, ref.at("loss_weights_x3").get<double>());
  EXPECT_EQ(ref.at("param_count_160m").get<int64_t>(), gpt_param_count(GPTConfig{}));
}

TEST(TrainGpt, RotaryIsTheReferencesFormula) {
  // cos/sin rounded to bf16, as Rotary.forward does; position 0 is the identity.
  auto [cos, sin] = rotary_cos_sin(4, 8, at::kCPU);
  EXPECT_EQ(cos.scalar_type(), at::kBFloat16);
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{4, 4}));
  at::Tensor x = at::randn({1, 4, 2, 8});
  at::Tensor y = apply_rotary(x, cos, sin);
  EXPECT_TRUE(at::equal(y.select(1, 0), x.select(1, 0)));
  // A rotation keeps each (x1, x2) pair's norm (up to the bf16 rounding of cos and sin: 1e-2).
  EXPECT_TRUE(at::allclose(y.norm(2, -1), x.norm(2, -1), 1e-2, 1e-2));
}

TEST(TrainGpt, PlaceholderWeightsThenInitGiveTheSameWeights) {
  // GPTConfig::placeholder_weights: 4-byte placeholders until init_weights, which draws each
  // weight as in place (the same generator draws in the same order) and passes it to `keep`.
  GPTConfig cfg{16, 64, 2, 2, 16};
  GPT whole(cfg);
  at::manual_seed(7);
  whole->init_weights();
  cfg.placeholder_weights = true;
  GPT lazy(cfg);
  for (const at::Tensor& p : lazy->parameters()) EXPECT_EQ(p.storage().nbytes(), size_t(4));
  std::vector<std::string> kept;
  at::manual_seed(7);
  lazy->init_weights([&](const std::string& name, const at::Tensor& full) {
    kept.push_back(name);
    return full;
  });
  auto a = whole->named_parameters(), b = lazy->named_parameters();
  ASSERT_EQ(kept.size(), a.size());
  for (const auto& item : a) {
    EXPECT_TRUE(at::equal(item.value(), b[item.key()])) << item.key();
    EXPECT_NE(std::find(kept.begin(), kept.end(), item.key()), kept.end()) << item.key();
  }
}

TEST(TrainGpt, CausalLogitsDoNotSeeTheFuture) {
  GPT model(GPTConfig{16, kVocabSize, 1, 2, 16});
  at::manual_seed(0);
  model->init_weights();
  at::NoGradGuard no_grad;
  at::Tensor a = at::randint(0, 50257, {1, 8}, at::kLong);
  at::Tensor b = a.clone();
  b.index_put_({0, 7}, (a[0][7] + 1) % 50257);
  at::Tensor la = model->logits(a), lb = model->logits(b);
  EXPECT_TRUE(at::allclose(la.slice(1, 0, 7), lb.slice(1, 0, 7)));
  EXPECT_FALSE(at::allclose(la.select(1, 7), lb.select(1, 7)));
}

}  // namespace
}  // namespace dion::train
