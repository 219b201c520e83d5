// Optimizer checkpoints: save -> load -> step must equal uninterrupted steps, bit for bit.
//
// What this pins: Optimizer::save / load (torch::serialize archives, so torch::save and
// torch::load of the optimizer work) carry every piece of state a step reads (momentum, AdamW's
// variance and per-parameter step, NorMuon's and NorDion2's per-neuron variance, legacy Dion's
// Q) and every group option (algorithm, lr, split_sizes, num_heads, dtypes, the step count),
// and map them onto the new optimizer's parameters by position. A resumed run must then be the
// same run: the comparison is at::equal, no tolerance, because both paths execute the same
// kernels on the same bits. Legacy Dion's randomized QR draws its sketch from the global
// generator, so both paths seed it identically before every step (set_grads does that).
// Loading a checkpoint with a different number of groups, a group with a different number of
// parameters, another global shape, dtype or algorithm fails with dion::ValueError naming the
// parameter and leaves the optimizer exactly as it was (docs/optimizers.md, "Checkpoints"; the
// layout-changing loads are in test_dist_checkpoint).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/serialize.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <ostream>
#include <string>
#include <vector>

#include "dion/dion.h"

namespace {

using Groups = std::vector<dion::ParamGroup>;
using MakeOptimizer = std::function<std::unique_ptr<dion::Optimizer>(const std::vector<at::Tensor>&)>;

// ---------------------------------------------------------------------------- helpers

struct Case {
  const char* name;
  std::vector<std::vector<int64_t>> shapes;
  MakeOptimizer make;
  at::ScalarType dtype = at::kFloat;
  int late = -1;  // a parameter that gets its first gradient only after the checkpoint
};

std::vector<at::Tensor> make_params(const Case& c) {
  at::manual_seed(1);
  std::vector<at::Tensor> out;
  for (const auto& s : c.shapes) out.push_back(at::randn(s).to(c.dtype));
  return out;
}

// Gradients for `step`, and the global generator seeded for the step's own draws.
void set_grads(const Case& c, const std::vector<at::Tensor>& params, int step, int checkpoint_step) {
  at::manual_seed(1000 + step);
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor g = at::randn(params[i].sizes()).to(c.dtype);
    params[i].mutable_grad() = (static_cast<int>(i) == c.late && step <= checkpoint_step) ? at::Tensor() : g;
  }
  at::manual_seed(2000 + step);
}

void run_steps(const Case& c, dion::Optimizer& opt, const std::vector<at::Tensor>& params, int from, int to,
               int checkpoint_step) {
  for (int step = from; step <= to; ++step) {
    set_grads(c, params, step, checkpoint_step);
    opt.step();
  }
}

std::vector<at::Tensor> state_tensors(const dion::ParamState& s) {
  return {s.momentum(), s.variance(), s.variance_neuron(), s.Q(), s.step_dev()};
}
const char* const kStateNames[] = {"momentum", "variance", "variance_neuron", "Q", "step_dev"};

// Every parameter, every state tensor and every group's options identical.
void expect_identical(dion::Optimizer& a, const std::vector<at::Tensor>& pa, dion::Optimizer& b,
                      const std::vector<at::Tensor>& pb, const std::string& what) {
  ASSERT_EQ(a.param_groups().size(), b.param_groups().size()) << what;
  for (size_t g = 0; g < a.param_groups().size(); ++g)
    EXPECT_TRUE(a.options(g) == b.options(g)) << what << ": options of group " << g;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i], pb[i])) << what << ": param " << i << " max |diff| "
                                         << (pa[i].to(at::kDouble) - pb[i].to(at::kDouble)).abs().max().item<double>();
    const dion::ParamState* sa = a.state_of(pa[i]);
    const dion::ParamState* sb = b.state_of(pb[i]);
    ASSERT_EQ(sa == nullptr, sb == nullptr) << what << ": state of param " << i;
    if (!sa) continue;
    const auto ta = state_tensors(*sa), tb = state_tensors(*sb);
    for (size_t k = 0; k < ta.size(); ++k) {
      ASSERT_EQ(ta[k].defined(), tb[k].defined()) << what << ": param " << i << " " << kStateNames[k];
      if (!ta[k].defined()) continue;
      EXPECT_EQ(ta[k].scalar_type(), tb[k].scalar_type()) << what << ": param " << i << " " << kStateNames[k];
      EXPECT_TRUE(at::equal(ta[k], tb[k])) << what << ": param " << i << " " << kStateNames[k];
    }
  }
}

// ---------------------------------------------------------------------------- cases

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"muon", {{16, 32}, {16, 32}, {32, 16}, {16}, {32}}, [](const auto& p) {
                   return std::make_unique<dion::Muon>(Groups{{{p[0], p[1], p[2]}, {.nesterov = true}},
                                                              {{p[3]}, {.algorithm = "adamw", .lr = 3e-3}},
                                                              {{p[4]}, {.algorithm = "lion", .lr = 1e-4}}},
                                                       dion::Muon::defaults().lr(0.02));
                 }});
  out.push_back({"muon_bf16_newton_schulz",
                 {{16, 32}, {16, 32}, {16}},
                 [](const auto& p) {
                   return std::make_unique<dion::Muon>(
                       Groups{{{p[0], p[1]}, {.cautious_wd = true}}, {{p[2]}, {.algorithm = "adamw"}}},
                       dion::Muon::defaults().lr(0.02),
                       dion::math::OrthoConfig{dion::math::OrthoMethod::NEWTON_SCHULZ, at::kBFloat16, {}});
                 },
                 at::kBFloat16});
  out.push_back({"normuon", {{24, 16}, {24, 16}, {16}, {24}}, [](const auto& p) {
                   return std::make_unique<dion::NorMuon>(
                       Groups{{{p[0], p[1]}, {.split_sizes = std::vector<int64_t>{8, 16}}},
                              {{p[2]}, {.algorithm = "adamw"}},
                              {{p[3]}, {.algorithm = "lion", .lr = 1e-4}}},
                       dion::NorMuon::defaults().lr(0.02));
                 }});
  out.push_back({"dion2", {{16, 32}, {32, 16}, {32, 16}, {16}, {32}}, [](const auto& p) {
                   return std::make_unique<dion::Dion2>(Groups{{{p[0], p[1], p[2]}},
                                                               {{p[3]}, {.algorithm = "adamw"}},
                                                               {{p[4]}, {.algorithm = "lion", .lr = 1e-4}}},
                                                        dion::Dion2::defaults().lr(0.02).fraction(0.5));
                 }});
  out.push_back({"nordion2", {{16, 32}, {32, 16}, {16}, {32}}, [](const auto& p) {
                   return std::make_unique<dion::Dion3>(Groups{{{p[0]}},
                                                               {{p[1]}, {.num_heads = 4}},
                                                               {{p[2]}, {.algorithm = "adamw"}},
                                                               {{p[3]}, {.algorithm = "lion", .lr = 1e-4}}},
                                                        dion::Dion3::defaults().lr(0.02));
                 }});
  // Legacy Dion at rank 1/2: P has more rows than columns, so every step runs the randomized
  // Cholesky QR and draws a sketch from the global generator.
  out.push_back({"dion", {{16, 32}, {32, 16}, {24, 24}, {16}, {32}}, [](const auto& p) {
                   return std::make_unique<dion::Dion>(Groups{{{p[0], p[1], p[2]}},
                                                              {{p[3]}, {.algorithm = "adamw"}},
                                                              {{p[4]}, {.algorithm = "lion", .lr = 1e-4}}},
                                                       dion::Dion::defaults().lr(0.02).rank_fraction(0.5));
                 }});
  out.push_back(
      {"dion_mixed_precision", {{16, 32}, {32, 16}, {16}}, [](const auto& p) {
         return std::make_unique<dion::Dion>(
             Groups{{{p[0], p[1]}}, {{p[2]}, {.algorithm = "adamw"}}},
             dion::Dion::defaults().lr(0.02).rank_fraction(0.25).momentum_dtype(at::kBFloat16).Q_dtype(at::kBFloat16));
       }});
  // Every algorithm in one optimizer, and a parameter (index 1) whose state is created only
  // after the checkpoint (legacy Dion would draw its Q then; here it is a muon parameter).
  out.push_back({"all_algorithms",
                 {{16, 32}, {16, 32}, {24, 16}, {16, 32}, {32, 16}, {24, 24}, {16}, {32}},
                 [](const auto& p) {
                   return std::make_unique<dion::Optimizer>(
                       Groups{{{p[0], p[1]}, {.algorithm = "muon"}},
                              {{p[2]}, {.algorithm = "normuon", .split_sizes = std::vector<int64_t>{8, 16}}},
                              {{p[3]}, {.algorithm = "dion2", .fraction = 0.25}},
                              {{p[4]}, {.algorithm = "nordion2", .num_heads = 2}},
                              {{p[5]}, {.algorithm = "dion", .rank_fraction = 0.5}},
                              {{p[6]}, {.algorithm = "adamw", .lr = 3e-3, .cautious_wd = true}},
                              {{p[7]}, {.algorithm = "lion", .lr = 1e-4}}},
                       dion::Options(0.02));
                 },
                 at::kFloat,
                 /*late=*/1});
  return out;
}

// ---------------------------------------------------------------------------- resume

// gtest prints a failing case by name rather than as raw bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Resume : public ::testing::TestWithParam<Case> {};

TEST_P(Resume, SaveLoadStepEqualsUninterruptedBitForBit) {
  const Case& c = GetParam();
  const int K = 3, L = 3;  // steps before the checkpoint, steps after it

  // Uninterrupted.
  std::vector<at::Tensor> pa = make_params(c);
  auto a = c.make(pa);
  run_steps(c, *a, pa, 1, K + L, K);

  // Interrupted: K steps, save, a fresh process's worth of objects, load, L steps.
  std::stringstream checkpoint;
  std::vector<at::Tensor> saved_params;
  {
    std::vector<at::Tensor> pb = make_params(c);
    auto b = c.make(pb);
    run_steps(c, *b, pb, 1, K, K);
    torch::serialize::OutputArchive archive;
    b->save(archive);
    archive.save_to(checkpoint);
    for (const at::Tensor& p : pb) saved_params.push_back(p.clone());
  }
  std::vector<at::Tensor> pc = make_params(c);
  for (size_t i = 0; i < pc.size(); ++i) pc[i].copy_(saved_params[i]);  // the model's own checkpoint
  auto resumed = c.make(pc);
  torch::serialize::InputArchive archive;
  archive.load_from(checkpoint);
  resumed->load(archive);
  for (size_t g = 0; g < resumed->param_groups().size(); ++g)
    EXPECT_EQ(resumed->options(g).step(), K) << "group " << g << ": the step count is restored";
  if (c.late >= 0) {
    EXPECT_EQ(resumed->state_of(pc[c.late]), nullptr) << "no state before its first gradient";
  }
  run_steps(c, *resumed, pc, K + 1, K + L, K);

  expect_identical(*a, pa, *resumed, pc, c.name);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Resume, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// torch::save / torch::load of the optimizer itself, through a file.
TEST(Checkpoint, TorchSaveLoadThroughAFile) {
  const Case c = cases()[0];
  std::string file_name("dion_test_checkpoint_");
  file_name += std::to_string(::getpid());
  file_name += ".pt";
  const std::filesystem::path path = std::filesystem::temp_directory_path() / file_name;
  std::vector<at::Tensor> pa = make_params(c), pb = make_params(c);
  auto a = c.make(pa), b = c.make(pb);
  run_steps(c, *a, pa, 1, 4, 4);
  run_steps(c, *b, pb, 1, 2, 4);
  torch::save(*b, path.string());
  std::vector<at::Tensor> pc = make_params(c);
  for (size_t i = 0; i < pc.size(); ++i) pc[i].copy_(pb[i]);
  auto resumed = c.make(pc);
  torch::load(*resumed, path.string());
  std::filesystem::remove(path);
  run_steps(c, *resumed, pc, 3, 4, 4);
  expect_identical(*a, pa, *resumed, pc, "torch::save/load");
}

// ---------------------------------------------------------------------------- options

TEST(Checkpoint, GroupOptionsRoundTrip) {
  // Save an optimizer whose groups differ from the defaults in many ways, load it into one
  // built with the same algorithms and otherwise plain defaults: the loaded options are the
  // saved ones, field for field. (Another algorithm is refused: RefusedLoads... below.)
  std::vector<at::Tensor> p = {at::randn({16, 32}), at::randn({24, 16}), at::randn({16, 32}), at::randn({16})};
  dion::Optimizer saved(Groups{{{p[0]},
                                {.algorithm = "dion2",
                                 .lr = 0.03,
                                 .fraction = 0.125,
                                 .ef_decay = 0.9,
                                 .adjust_lr = dion::AdjustLR::RMS_NORM,
                                 .num_heads = 4,
                                 .selection_scope = "global"}},
                               {{p[1]},
                                {.algorithm = "normuon",
                                 .mu = 0.9,
                                 .muon_beta2 = 0.99,
                                 .nesterov = true,
                                 .split_sizes = std::vector<int64_t>{8, 16}}},
                               {{p[2]}, {.algorithm = "dion", .rank_fraction = 0.5, .rank_multiple_of = 4}},
                               {{p[3]},
                                {.algorithm = "adamw",
                                 .lr = 3e-4,
                                 .weight_decay = 0.0,
                                 .betas = std::make_tuple(0.8, 0.99),
                                 .epsilon = 1e-10,
                                 .cautious_wd = true}}},
                        dion::Options(0.01).oversample(1.5).variance_dtype(at::kFloat).Q_dtype(at::kBFloat16));
  for (const at::Tensor& t : p) t.mutable_grad() = at::randn_like(t);
  saved.step();
  saved.step();
  std::stringstream buffer;
  torch::save(saved, buffer);

  std::vector<at::Tensor> q = {at::randn({16, 32}), at::randn({24, 16}), at::randn({16, 32}), at::randn({16})};
  dion::Optimizer loaded(Groups{{{q[0]}, {.algorithm = "dion2"}},
                                {{q[1]}, {.algorithm = "normuon"}},
                                {{q[2]}, {.algorithm = "dion"}},
                                {{q[3]}, {.algorithm = "adamw"}}},
                         dion::Options(0.5));
  torch::load(loaded, buffer);
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_TRUE(loaded.options(g) == saved.options(g)) << "group " << g;
    EXPECT_EQ(loaded.options(g).step(), 2) << "group " << g;
  }
  EXPECT_EQ(loaded.options(0).algorithm(), "dion2");
  EXPECT_EQ(loaded.options(0).lr(), 0.03);
  EXPECT_EQ(loaded.options(0).selection_scope(), "global");
  EXPECT_EQ(loaded.options(0).adjust_lr(), dion::AdjustLR::RMS_NORM);
  EXPECT_EQ(loaded.options(1).split_sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(loaded.options(2).Q_dtype(), std::optional<at::ScalarType>(at::kBFloat16));
  EXPECT_EQ(loaded.options(3).betas(), std::make_tuple(0.8, 0.99));
  EXPECT_EQ(loaded.options(3).variance_dtype(), std::optional<at::ScalarType>(at::kFloat));
  EXPECT_EQ(loaded.options(0).momentum_dtype(), std::nullopt);
}

TEST(Checkpoint, OptionsEqualAfterRoundTrip) {
  const std::vector<dion::Options> all = {
      dion::Options(),
      dion::Muon::defaults(),
      dion::Options(0.7)
          .algorithm("nordion2")
          .weight_decay(0.2)
          .mu(0.8)
          .muon_beta2(0.85)
          .betas(std::make_tuple(0.5, 0.6))
          .epsilon(1e-5)
          .fraction(0.3)
          .ef_decay(0.9)
          .adjust_lr(dion::AdjustLR::NONE)
          .cautious_wd(true)
          .nesterov(true)
          .flatten(true)
          .num_heads(0)
          .split_sizes({3, 5, 7})
          .selection_scope("global")
          .rank_fraction(0.4)
          .rank_multiple_of(8)
          .oversample(2.5)
          .momentum_dtype(at::kBFloat16)
          .Q_dtype(at::kHalf)
          .variance_dtype(at::kDouble)
          .step(123456789),
  };
  for (size_t i = 0; i < all.size(); ++i) {
    torch::serialize::OutputArchive out;
    all[i].serialize(out);
    std::stringstream buffer;
    out.save_to(buffer);
    torch::serialize::InputArchive in;
    in.load_from(buffer);
    dion::Options back(0.0);
    back.algorithm("lion").split_sizes({1, 1}).momentum_dtype(at::kFloat);  // must all be overwritten
    back.serialize(in);
    EXPECT_TRUE(back == all[i]) << "options " << i;
  }
}

// ---------------------------------------------------------------------------- mismatches

TEST(Checkpoint, LoadIntoDifferentGroupsFails) {
  std::vector<at::Tensor> p = {at::randn({16, 32}), at::randn({16})};
  for (const at::Tensor& t : p) t.mutable_grad() = at::randn_like(t);
  dion::Optimizer saved(Groups{{{p[0]}}, {{p[1]}, {.algorithm = "adamw"}}}, dion::Options(0.02));
  saved.step();
  std::stringstream buffer;
  torch::save(saved, buffer);
  const std::string bytes = buffer.str();

  auto expect_load_error = [&](dion::Optimizer& target, const std::string& needle, const std::string& what) {
    std::istringstream in(bytes);
    try {
      torch::load(target, in);
      ADD_FAILURE() << what << ": load succeeded";
    } catch (const dion::ValueError& e) {
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, e.what()) << what;
    }
  };

  // Three groups instead of two: refused before anything is changed.
  std::vector<at::Tensor> q = {at::randn({16, 32}), at::randn({16}), at::randn({8})};
  dion::Optimizer three(
      Groups{{{q[0]}, {.lr = 0.5}}, {{q[1]}, {.algorithm = "adamw"}}, {{q[2]}, {.algorithm = "lion"}}},
      dion::Options(0.02));
  expect_load_error(three, "the checkpoint has 2 param groups, this optimizer has 3", "3 groups vs 2");
  EXPECT_EQ(three.options(0).lr(), 0.5) << "the options are untouched";
  EXPECT_EQ(three.options(0).step(), 0);
  EXPECT_EQ(three.state_of(q[0]), nullptr) << "no state was loaded";

  // One group instead of two.
  dion::Optimizer one(Groups{{{q[0]}}}, dion::Options(0.02));
  expect_load_error(one, "the checkpoint has 2 param groups, this optimizer has 1", "1 group vs 2");

  // Same number of groups, a different number of parameters in one.
  dion::Optimizer wider(Groups{{{q[0], at::randn({16, 32})}}, {{q[1]}, {.algorithm = "adamw"}}}, dion::Options(0.02));
  expect_load_error(wider, "param group 0: the checkpoint has 1 parameters, this group has 2",
                    "2 params vs 1 in group 0");
}

// Regression: a load that fails part-way used to leave the optimizer half-changed (earlier
// groups' state and options replaced), and state tensors were never checked against the
// parameters. Now a failed load restores everything, and a state tensor of the wrong shape
// (a checkpoint of another model) is refused with a message naming group, parameter and key.
TEST(Checkpoint, FailedLoadChangesNothing) {
  std::vector<at::Tensor> p = {at::randn({16, 32}), at::randn({16})};
  for (const at::Tensor& t : p) t.mutable_grad() = at::randn_like(t);
  dion::Optimizer saved(Groups{{{p[0]}}, {{p[1]}, {.algorithm = "adamw"}}}, dion::Options(0.02));
  saved.step();
  std::stringstream buffer;
  torch::save(saved, buffer);

  // Same structure, other shapes: state shapes do not fit.
  std::vector<at::Tensor> q = {at::randn({8, 32}), at::randn({16})};
  for (const at::Tensor& t : q) t.mutable_grad() = at::randn_like(t);
  dion::Optimizer target(Groups{{{q[0]}, {.lr = 0.5}}, {{q[1]}, {.algorithm = "adamw"}}}, dion::Options(0.02));
  target.step();
  const at::Tensor momentum_before = target.state_of(q[0])->momentum().clone();
  try {
    torch::load(target, buffer);
    ADD_FAILURE() << "loading state of shape [16, 32] for a [8, 32] parameter succeeded";
  } catch (const dion::ValueError& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "param group 0, parameter 0", e.what());
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "global shape [8, 32]", e.what());
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "the checkpoint's parameter has global shape [16, 32]", e.what());
  }
  EXPECT_EQ(target.options(0).lr(), 0.5) << "options restored";
  EXPECT_EQ(target.options(0).step(), 1) << "step count restored";
  ASSERT_NE(target.state_of(q[0]), nullptr);
  EXPECT_TRUE(at::equal(target.state_of(q[0])->momentum(), momentum_before)) << "state restored";
}

// All or nothing, for every kind of refusal: the optimizer (options, state, step counts) is
// exactly as before — checked by saving it before and after and comparing the bytes.
TEST(Checkpoint, RefusedLoadsLeaveTheOptimizerExactlyAsItWas) {
  auto bytes_of = [](const dion::Optimizer& opt) {
    std::stringstream out;
    torch::save(opt, out);
    return out.str();
  };
  auto stepped = [](dion::Optimizer& opt, const std::vector<at::Tensor>& params) {
    for (const at::Tensor& t : params) t.mutable_grad() = at::randn_like(t);
    opt.step();
  };
  // The checkpoint: legacy Dion on a [16, 32] matrix, plus an AdamW vector.
  std::vector<at::Tensor> p = {at::randn({16, 32}), at::randn({16})};
  dion::Optimizer source(Groups{{{p[0]}, {.algorithm = "dion"}}, {{p[1]}, {.algorithm = "adamw"}}},
                         dion::Options(0.02));
  stepped(source, p);
  const std::string checkpoint = bytes_of(source);

  struct Refusal {
    std::string what, needle;
    std::vector<at::Tensor> params;
    std::string algorithm;
  };
  std::vector<Refusal> refusals = {
      {"algorithm",
       "the checkpoint's algorithm is 'dion', this group's is 'muon'",
       {at::randn({16, 32}), at::randn({16})},
       "muon"},
      {"dtype",
       "the checkpoint's parameter is Float, this one BFloat16",
       {at::randn({16, 32}).to(at::kBFloat16), at::randn({16})},
       "dion"},
      {"global shape",
       "param group 1, parameter 0 (global shape [24]): the checkpoint's parameter has global shape [16]",
       {at::randn({16, 32}), at::randn({24})},
       "dion"},
  };
  for (Refusal& r : refusals) {
    dion::Optimizer target(
        Groups{{{r.params[0]}, {.algorithm = r.algorithm, .lr = 0.5}}, {{r.params[1]}, {.algorithm = "adamw"}}},
        dion::Options(0.02));
    stepped(target, r.params);
    stepped(target, r.params);
    const std::string before = bytes_of(target);
    std::istringstream in(checkpoint);
    try {
      torch::load(target, in);
      ADD_FAILURE() << r.what << ": the load was accepted";
    } catch (const dion::ValueError& e) {
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, r.needle, e.what()) << r.what;
    }
    EXPECT_EQ(bytes_of(target), before) << r.what << ": the refused load changed the optimizer";
    EXPECT_EQ(target.options(0).step(), 2) << r.what;
  }
}

// Checkpoints of the earlier format (LibTorch's torch::optim::serialize, no layout) still load.
TEST(Checkpoint, EarlierFormatStillLoads) {
  std::vector<at::Tensor> p = {at::randn({16, 32}), at::randn({16})};
  for (const at::Tensor& t : p) t.mutable_grad() = at::randn_like(t);
  dion::Optimizer source(Groups{{{p[0]}, {.algorithm = "normuon"}}, {{p[1]}, {.algorithm = "adamw"}}},
                         dion::Options(0.02));
  source.step();
  torch::serialize::OutputArchive out;
  torch::optim::serialize<dion::ParamState, dion::Options>(out, source);
  std::stringstream buffer;
  out.save_to(buffer);
  std::vector<at::Tensor> q = {p[0].detach().clone(), p[1].detach().clone()};
  dion::Optimizer target(Groups{{{q[0]}, {.algorithm = "normuon"}}, {{q[1]}, {.algorithm = "adamw"}}},
                         dion::Options(0.02));
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  target.load(in);
  expect_identical(source, p, target, q, "earlier format");
}

// variance_dtype may differ from the parameter's (the reference's DionMixedPrecisionConfig: a bf16
// variance of a float32 parameter): the state has that dtype, the step runs the reference's
// unfused adamw_update and stays within bf16's rounding of the fused float32 step: a step moves an
// element by about lr (0.02) times M / denom, and denom passes four bf16 roundings (V, its sqrt,
// the division, + eps), each at most 2^-9 relative: 0.02 x 4 x 2^-9 = 1.6e-4 a step, 3.2e-4 over
// the two (measured: 1.2e-4). A dtype that is not floating point is refused.
TEST(Checkpoint, AdamwVarianceDtypeMayDifferFromTheParameter) {
  at::manual_seed(3);
  const at::Tensor init = at::randn({16}), grad = at::randn({16});
  at::Tensor a = init.clone(), b = init.clone();
  dion::Optimizer fused(Groups{{{a}, {.algorithm = "adamw"}}}, dion::Options(0.02));
  dion::Optimizer mixed(Groups{{{b}, {.algorithm = "adamw"}}}, dion::Options(0.02).variance_dtype(at::kBFloat16));
  for (int s = 0; s < 2; ++s) {
    a.mutable_grad() = grad.clone();
    b.mutable_grad() = grad.clone();
    fused.step();
    mixed.step();
  }
  EXPECT_EQ(mixed.state_of(b)->variance().scalar_type(), at::kBFloat16);
  EXPECT_EQ(fused.state_of(a)->variance().scalar_type(), at::kFloat);
  EXPECT_LE((a - b).abs().max().item<double>(), 2 * 0.02 * 4 * std::ldexp(1.0, -9));
  EXPECT_GT((b - init).abs().min().item<double>(), 0.01);  // it stepped (about lr per step)
  try {
    dion::Optimizer opt(Groups{{{at::randn({4})}, {.algorithm = "adamw"}}},
                        dion::Options(0.02).variance_dtype(at::kLong));
    ADD_FAILURE() << "an int64 variance was accepted";
  } catch (const dion::ValueError& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "must be a floating-point dtype", e.what());
  }
}

}  // namespace
