// Device scalars (dion/math/rates.h, Optimizer::set_device_scalars): lr and weight decay read from
// 0-d float32 tensors on the parameters' device, as a captured CUDA graph needs them.
//
// On CPU these pin that the device form gives exactly what the host form gives (bit for bit:
// every derived value is one float32 operation either way), under an lr and weight-decay schedule,
// for every algorithm, fp32 and bf16, cautious weight decay on and off; and that the math reads
// the tensors, not the host copies (a device form whose host copies are wrong still gives the
// right result). The graph replay itself is checked on a GPU (tests/cuda/test_cuda.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dion/dion.h"
#include "dion/math/dion2.h"
#include "dion/math/muon.h"
#include "dion/math/nordion2.h"
#include "dion/math/rates.h"
#include "dion/math/scalar.h"

namespace {

using Groups = std::vector<dion::ParamGroup>;

struct Trajectory {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> state;  // every state tensor after the run, in order
};

// Two matrix parameters [24, 40] (same shape: one megabatch) and a [16, 40] one, `steps` steps
// with the lr and weight decay changing every step; the same seeds, so legacy Dion's random
// draws repeat.
Trajectory run(const std::string& algo, at::ScalarType dtype, bool cautious, bool device_scalars, int steps = 4) {
  at::manual_seed(11);
  std::vector<at::Tensor> params;
  for (auto shape : {std::vector<int64_t>{24, 40}, {24, 40}, {16, 40}}) params.push_back(at::randn(shape).to(dtype));
  dion::Optimizer opt(Groups{{params, {.algorithm = algo, .cautious_wd = cautious}}},
                      dion::Options(0.02).weight_decay(0.1));
  opt.set_device_scalars(device_scalars);
  at::manual_seed(12);
  opt.init_state();
  for (int t = 0; t < steps; ++t) {
    at::manual_seed(100 + t);
    for (at::Tensor& p : params) p.mutable_grad() = at::randn(p.sizes()).to(dtype);
    opt.options(0).lr(0.02 * (1.0 - 0.2 * t)).weight_decay(0.1 + 0.05 * t);  // a schedule
    at::manual_seed(200 + t);
    opt.step();
  }
  Trajectory r{params, {}};
  for (const at::Tensor& p : params) {
    const dion::ParamState* s = opt.state_of(p);
    for (const at::Tensor& t : {s->momentum(), s->variance(), s->variance_neuron(), s->Q(), s->step_dev()})
      if (t.defined()) r.state.push_back(t);
  }
  return r;
}

TEST(DeviceScalars, EqualHostScalarsBitForBitUnderASchedule) {
  for (const std::string algo : {"muon", "normuon", "dion2", "nordion2", "dion", "adamw", "lion"})
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
      for (bool cautious : {false, true}) {
        if (cautious && algo != "muon" && algo != "normuon" && algo != "adamw" && algo != "lion") continue;
        SCOPED_TRACE(algo + " " + c10::toString(dtype) + (cautious ? " cautious_wd" : ""));
        const Trajectory host = run(algo, dtype, cautious, false), device = run(algo, dtype, cautious, true);
        const Trajectory start = run(algo, dtype, cautious, false, 0);
        for (size_t i = 0; i < host.params.size(); ++i) {
          EXPECT_FALSE(at::equal(host.params[i], start.params[i])) << "parameter " << i << " did not move";
          EXPECT_TRUE(at::equal(host.params[i], device.params[i])) << "parameter " << i;
        }
        ASSERT_EQ(host.state.size(), device.state.size());
        for (size_t i = 0; i < host.state.size(); ++i) EXPECT_TRUE(at::equal(host.state[i], device.state[i])) << i;
      }
}

// The optimizer keeps one pair of tensors per group for its lifetime (a captured graph holds
// their addresses) and fills them in place from the groups' values.
TEST(DeviceScalars, FilledInPlaceFromTheGroups) {
  at::Tensor w = at::randn({8, 8}), b = at::randn({8});
  dion::Optimizer opt(Groups{{{w}}, {{b}, {.algorithm = "adamw", .lr = 0.003, .weight_decay = 0.0}}, {{}}},
                      dion::Options(0.02));
  EXPECT_FALSE(opt.device_scalars());
  EXPECT_FALSE(opt.device_scalars_of(0).lr.defined());
  opt.set_device_scalars(true);
  const dion::DeviceScalars& d0 = opt.device_scalars_of(0);
  ASSERT_TRUE(d0.lr.defined());
  EXPECT_EQ(d0.lr.dim(), 0);
  EXPECT_EQ(d0.lr.scalar_type(), at::kFloat);
  EXPECT_EQ(d0.lr.item<float>(), 0.02f);
  EXPECT_EQ(d0.weight_decay.item<float>(), 0.01f);
  EXPECT_EQ(opt.device_scalars_of(1).lr.item<float>(), 0.003f);
  EXPECT_FALSE(opt.device_scalars_of(2).lr.defined());  // no parameters: nothing reads it
  const void* where = d0.lr.data_ptr();
  opt.options(0).lr(0.5).weight_decay(0.25);
  opt.refresh_device_scalars();
  EXPECT_EQ(opt.device_scalars_of(0).lr.item<float>(), 0.5f);
  EXPECT_EQ(opt.device_scalars_of(0).weight_decay.item<float>(), 0.25f);
  EXPECT_EQ(opt.device_scalars_of(0).lr.data_ptr(), where);
  w.mutable_grad() = at::randn({8, 8});
  opt.options(0).lr(0.125);
  opt.step();  // step() fills them first
  EXPECT_EQ(opt.device_scalars_of(0).lr.item<float>(), 0.125f);
  EXPECT_EQ(opt.device_scalars_of(0).lr.data_ptr(), where);
}

// The math reads the tensors: a device form whose host copies are wrong (999) still gives the
// host form's result with the right values.
TEST(DeviceScalars, MathReadsTheTensorsNotTheHostCopies) {
  namespace m = dion::math;
  const float lr = 0.03f, wd = 0.2f, factor = 1.5f;
  const at::Tensor lr_t = at::scalar_tensor(lr, at::kFloat), wd_t = at::scalar_tensor(wd, at::kFloat);
  const m::Rates host = m::Rates::host(lr, wd).adjusted(factor);
  const m::Rates dev = m::Rates::device(lr_t, wd_t, 999.0f, 999.0f).adjusted(factor);
  EXPECT_EQ(dev.decay_t().item<float>(), host.decay());
  EXPECT_EQ(dev.adjusted_lr_t().item<float>(), lr * factor);
  EXPECT_EQ(dev.neg_adjusted_lr_t().item<float>(), -(lr * factor));
  EXPECT_EQ(dev.lr_wd_t().item<float>(), lr * wd);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(5);
    const at::Tensor X0 = at::randn({12, 20}).to(dtype), U = at::randn({12, 20}).to(dtype);
    const at::Tensor M0 = at::randn({12, 20}).to(dtype);
    for (bool cautious : {false, true}) {
      at::Tensor a = X0.clone(), b = X0.clone();
      m::muon_post({a}, {U}, host, cautious);
      m::muon_post({b}, {U}, dev, cautious);
      EXPECT_FALSE(at::equal(a, X0));
      EXPECT_TRUE(at::equal(a, b)) << "muon_post, cautious " << cautious;
    }
    {
      const at::Tensor idx = at::tensor({1, 4, 7}, at::kLong);
      const at::Tensor Us = U.index_select(0, idx);
      at::Tensor a = X0.clone(), b = X0.clone();
      m::dion2_post({a}, {Us}, {idx}, host, -2);
      m::dion2_post({b}, {Us}, {idx}, dev, -2);
      EXPECT_TRUE(at::equal(a, b)) << "dion2_post";
      at::Tensor Um = U.clone();
      Um.narrow(0, 0, 6).zero_();
      at::Tensor Ma = M0.clone(), Mb = M0.clone();
      a = X0.clone(), b = X0.clone();
      m::dion2_post_masked({a}, {Ma}, {Um}, host, 0.9f, -2);
      m::dion2_post_masked({b}, {Mb}, {Um}, dev, 0.9f, -2);
      EXPECT_TRUE(at::equal(a, b) && at::equal(Ma, Mb)) << "dion2_post_masked";
      at::Tensor Va = at::rand({12, 1}).to(dtype), Vb = Va.clone();
      Ma = M0.clone(), Mb = M0.clone(), a = X0.clone(), b = X0.clone();
      m::nordion2_post_masked({a}, {Ma}, {Va}, {Um}, host, 0.9f, 0.95f);
      m::nordion2_post_masked({b}, {Mb}, {Vb}, {Um}, dev, 0.9f, 0.95f);
      EXPECT_TRUE(at::equal(a, b) && at::equal(Va, Vb)) << "nordion2_post_masked";
    }
    {
      at::Tensor a = X0.clone(), b = X0.clone(), Ma = M0.clone(), Mb = M0.clone();
      m::lion_update({a}, {U}, {Ma}, {lr, 0.9f, 0.99f, wd, false});
      m::lion_update({b}, {U}, {Mb}, {999.0f, 0.9f, 0.99f, 999.0f, false, lr_t, wd_t});
      EXPECT_TRUE(at::equal(a, b)) << "lion";
    }
    {
      at::Tensor a = X0.clone(), b = X0.clone(), Ma = M0.clone(), Mb = M0.clone();
      at::Tensor Va = at::zeros_like(X0), Vb = at::zeros_like(X0);
      at::Tensor sa = at::zeros({}, at::kFloat), sb = at::zeros({}, at::kFloat);
      m::adamw_update({a}, {U}, {Ma}, {Va}, {sa}, {lr, 0.9f, 0.95f, wd, 1e-8f, true});
      m::adamw_update({b}, {U}, {Mb}, {Vb}, {sb}, {999.0f, 0.9f, 0.95f, wd, 1e-8f, true, lr_t});
      EXPECT_FALSE(at::equal(a, X0));
      EXPECT_TRUE(at::equal(a, b)) << "adamw (lr on the device)";
    }
  }
}

}  // namespace
