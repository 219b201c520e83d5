// examples/readme_example.cpp — the README's C++ example: a linear layer trained with Dion2.
#include <cstdio>

#include "dion/dion.h"

int main() {
  torch::manual_seed(0);
  torch::nn::Linear layer(64, 32);
  torch::Tensor x = torch::randn({256, 64}), y = torch::tanh(x.matmul(torch::randn({64, 32}) / 8));
  dion::Optimizer opt({{{layer->weight}},                          // matrix: Dion2
                       {{layer->bias}, {.algorithm = "adamw"}}},  // vector: AdamW
                      dion::Options(0.02).algorithm("dion2").fraction(0.25));
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    torch::Tensor loss = torch::mse_loss(layer(x), y);
    loss.backward();
    opt.step();
    last = loss.item<float>();
    if (step == 0) first = last;
  }
  std::printf("dion2: loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
