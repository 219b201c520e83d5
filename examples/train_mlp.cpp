// examples/train_mlp.cpp — the first program to run and copy: train a small MLP with Dion2.
//
// The task is synthetic regression: y = tanh(x W*) for a hidden W*, so the loss can go to ~0.
// The model's weight matrices go to a Dion2 group (orthonormalized updates on a quarter of the
// rows or columns); biases, which are vectors, go to an AdamW group. The loss is printed
// every step.
//
//   build/examples/train_mlp [--steps N] [--algorithm muon|normuon|dion2|nordion2|dion]
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "dion/dion.h"

int main(int argc, char** argv) {
  int steps = 60;
  std::string algorithm = "dion2";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--algorithm") && i + 1 < argc) algorithm = argv[++i];
    else {
      std::printf("usage: %s [--steps N] [--algorithm muon|normuon|dion2|nordion2|dion]\n", argv[0]);
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  torch::manual_seed(0);

  // ------------------------------------------------------------------ data: y = tanh(x W*)
  const int64_t B = 256, D_in = 64, D_hidden = 256, D_out = 32;
  torch::Tensor x = torch::randn({B, D_in});                           // [B, D_in]
  torch::Tensor y = torch::tanh(x.matmul(torch::randn({D_in, D_out}) / 8));  // [B, D_out]

  // ------------------------------------------------------------------ model
  torch::nn::Linear fc1(D_in, D_hidden), fc2(D_hidden, D_hidden), fc3(D_hidden, D_out);

  // ------------------------------------------------------------------ optimizer
  // Matrices -> the matrix algorithm (Dion2 by default); vectors -> AdamW.
  std::vector<torch::Tensor> matrices = {fc1->weight, fc2->weight, fc3->weight};
  std::vector<torch::Tensor> vectors = {fc1->bias, fc2->bias, fc3->bias};
  dion::Options defaults = dion::Options(0.02).algorithm(algorithm).fraction(0.25).weight_decay(0.0);
  dion::Optimizer opt(
      {
          {matrices},                                             // the defaults above
          {vectors, {.algorithm = "adamw", .lr = 1e-2, .weight_decay = 0.0}},  // overrides
      },
      defaults);

  // ------------------------------------------------------------------ training loop
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
}
