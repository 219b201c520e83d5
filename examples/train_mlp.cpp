// examples/train_mlp.cpp — the first program to run and copy: train a small MLP with Dion2.
//
// The task is synthetic regression: y = tanh(x W*) for a hidden W*, so the loss can go to ~0.
// The model's weight matrices go to a Dion2 group (orthonormalized updates on a quarter of the
// rows or columns); biases, which are vectors, go to an AdamW group. The loss is printed
// every step.
//
//   build/examples/train_mlp [--steps N] [--algorithm muon|normuon|dion2|nordion2|dion]
//                            [--lr LR] [--seed S]      (--help explains each)
//
// Exit codes: 0 the loss went down, 1 it did not (or the optimizer refused the settings),
// 2 a bad command line (the message names the option and what is valid).
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/linear.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "dion/dion.h"

int main(int argc, char** argv) {
  int steps = 60;
  std::string algorithm = "dion2";
  double lr = 0.02;
  uint64_t seed = 0;
  CLI::App app{
      "train_mlp: trains a 3-layer MLP on synthetic regression (y = tanh(x W*)) with a dion "
      "matrix optimizer for the weights and AdamW for the biases, printing the loss each step.",
      "train_mlp"};
  app.add_option("--steps", steps, "Optimizer steps to run (a whole number >= 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--algorithm", algorithm,
                 "Algorithm for the weight matrices: muon, normuon, dion2 (a quarter of the rows "
                 "or columns per step), nordion2, dion (low-rank)")
      ->capture_default_str()
      ->check(CLI::IsMember({"muon", "normuon", "dion2", "nordion2", "dion"}));
  app.add_option("--lr", lr, "Learning rate of the weight matrices (> 0; biases use 1e-2)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed for the data and the initial weights")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; any bad flag or value: a usage error
  }

  try {
    torch::manual_seed(seed);

    // ---------------------------------------------------------------- data: y = tanh(x W*)
    const int64_t B = 256, D_in = 64, D_hidden = 256, D_out = 32;
    torch::Tensor x = torch::randn({B, D_in});                                 // [B, D_in]
    torch::Tensor y = torch::tanh(x.matmul(torch::randn({D_in, D_out}) / 8));  // [B, D_out]

    // ---------------------------------------------------------------- model
    torch::nn::Linear fc1(D_in, D_hidden), fc2(D_hidden, D_hidden), fc3(D_hidden, D_out);

    // ---------------------------------------------------------------- optimizer
    // Matrices -> the matrix algorithm (Dion2 by default); vectors -> AdamW.
    std::vector<torch::Tensor> matrices = {fc1->weight, fc2->weight, fc3->weight};
    std::vector<torch::Tensor> vectors = {fc1->bias, fc2->bias, fc3->bias};
    dion::Options defaults = dion::Options(lr).algorithm(algorithm).fraction(0.25).weight_decay(0.0);
    dion::Optimizer opt(
        {
            {matrices},                                                          // the defaults
            {vectors, {.algorithm = "adamw", .lr = 1e-2, .weight_decay = 0.0}},  // overrides
        },
        defaults);

    // ---------------------------------------------------------------- training loop
    float first = 0, last = 0;
    for (int step = 1; step <= steps; ++step) {
      opt.zero_grad();
      torch::Tensor h = torch::relu(fc1(x));
      h = torch::relu(fc2(h));
      torch::Tensor loss = torch::mse_loss(fc3(h), y);
      loss.backward();
      opt.step();
      last = loss.item<float>();
      if (step == 1) first = last;
      std::printf("step %3d  loss %.6f\n", step, last);
    }
    std::printf("%s: loss %.4f -> %.4f (%.1fx lower)\n", algorithm.c_str(), first, last, first / last);
    return last < first ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: error: %s\n", e.what());
    return 1;
  }
}
