// tests/consumer/main.cpp — a program of another project that uses the installed dion library.
//
// Built by tests/consumer/CMakeLists.txt against what `cmake --install` wrote (find_package(dion)),
// never against the source tree. This file includes only "dion/dion.h" (and <cstdio>) and runs the
// optimizer setup of examples/train_mlp.cpp (between the markers below) on a small MLP; other_targets.cpp
// uses dion::comm and dion::data. Exit 0 when the loss went down and the other checks passed.
#include <cstdio>

#include "dion/dion.h"

int check_other_targets();  // other_targets.cpp: 0 when dion::comm and dion::data work

int main() {
  torch::manual_seed(0);
  const int steps = 20;
  // A small MLP on y = tanh(x W*), as examples/train_mlp.cpp.
  torch::Tensor x = torch::randn({64, 16});                            // [B, 16]
  torch::Tensor y = torch::tanh(x.matmul(torch::randn({16, 8})) / 4);  // [B, 8]
  torch::nn::Linear fc1(16, 32), fc2(32, 32), fc3(32, 8);
  auto model = [&](const torch::Tensor& in) { return fc3(torch::relu(fc2(torch::relu(fc1(in))))); };
  torch::Tensor first_loss = torch::mse_loss(model(x), y).detach();

  // ---- the optimizer setup and loop of examples/train_mlp.cpp
  std::vector<torch::Tensor> matrices = {fc1->weight, fc2->weight, fc3->weight};
  std::vector<torch::Tensor> vectors = {fc1->bias, fc2->bias, fc3->bias};
  dion::Optimizer opt(
      {
          {matrices},                                                          // the defaults
          {vectors, {.algorithm = "adamw", .lr = 1e-2, .weight_decay = 0.0}},  // overrides
      },
      dion::Options(0.02).algorithm("dion2").fraction(0.25).weight_decay(0.0));

  for (int step = 1; step <= steps; ++step) {
    opt.zero_grad();
    torch::Tensor loss = torch::mse_loss(model(x), y);
    loss.backward();
    opt.step();
  }
  // ---- end of the train_mlp.cpp setup

  float before = first_loss.item<float>();
  float after = torch::mse_loss(model(x), y).item<float>();
  std::printf("consumer: dion2 loss %.6f -> %.6f\n", before, after);
  if (!(after < before)) {
    std::printf("consumer: FAILED: the loss did not go down\n");
    return 1;
  }
  return check_other_targets();
}
