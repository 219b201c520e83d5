// tests/train/test_trainer.cpp — the Trainer (dion/train/trainer.h) in process: its test seams.
//
// TrainHooks are how a test reaches inside a step without the library reading the environment
// (dion-train's DION_TEST_* variables are parsed in tools/dion-train/test_hooks.cpp and arrive
// as these same hooks; tests/train/test_numerics.cpp and test_parallel.cpp run them as
// subprocesses). Here: after_backward and after_update run once per training step, in step
// order, on rank 0 of a one-process run, with the model's parameters and their gradients; a NaN
// written into a gradient through after_backward makes that step skipped, as the guard says.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "dion/train/config.h"
#include "dion/train/trainer.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

Config parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dion-train");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return config_parse(int(argv.size()), argv.data());
}

TEST(TrainerHooks, RunEveryStepAndANaNWrittenThroughThemSkipsThatStep) {
  test::TempDir tmp("trainer_hooks");
  // Debug mode: 20 steps on synthetic tokens (a small vocabulary keeps it fast).
  const Config config = parse({"--debug",           "true",
                               "--device",          "cpu",
                               "--dtype",           "fp32",
                               "--model_dim",       "64",
                               "--n_layer",         "2",
                               "--n_head",          "2",
                               "--sequence_length", "32",
                               "--vocab_size",      "256",
                               "--val_loss_every",  "0",
                               "--optimizer",       "muon",
                               "--scalar_opt",      "adamw",
                               "--peak_tflops",     "1",
                               "--run_dir",         (tmp / "run").string()});
  std::vector<int64_t> after_backward, after_update;
  TrainHooks hooks;
  hooks.after_backward = [&](int rank, int64_t step, const std::vector<at::Tensor>& params) {
    EXPECT_EQ(rank, 0);
    after_backward.push_back(step);
    if (step != 3) return;
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params)
      if (p.grad().defined() && p.grad().numel() > 0) {
        p.grad().view({-1}).narrow(0, 0, 1).fill_(std::nan(""));
        return;
      }
    ADD_FAILURE() << "no parameter has a gradient after backward";
  };
  hooks.after_update = [&](int rank, int64_t step, const std::vector<at::Tensor>& params) {
    EXPECT_EQ(rank, 0);
    EXPECT_FALSE(params.empty());
    after_update.push_back(step);
  };
  const RunSummary s = Trainer(config, hooks).run();

  std::vector<int64_t> every(20);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(after_backward, every);
  EXPECT_EQ(after_update, every);
  EXPECT_EQ(s.steps_done, 20);
  EXPECT_EQ(s.steps_skipped, 1);
  const auto records = test::read_metrics(tmp / "run" / "metrics.jsonl");
  int64_t skipped_step = -1;
  for (const auto& r : records)
    if (r.kind == "train" && r.skipped) skipped_step = r.step;
  EXPECT_EQ(skipped_step, 3);
}

}  // namespace
}  // namespace dion::train
