// MFU: the model's FLOPs per token and a measured matmul peak (see include/dion/train/mfu.h).
#include "dion/train/mfu.h"

#include "dion/train/kernels.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>

#include <algorithm>
#include <chrono>

namespace dion::train {

double flops_per_token(const GPTConfig& c) {
  const double N = double(gpt_active_param_count(c));  // an MoE: the parameters a token computes with
  return 6.0 * N + 12.0 * double(c.n_layer) * double(c.sequence_len) * double(c.n_embd);
}

double measure_matmul_flops(const c10::Device& device, c10::ScalarType dtype, int64_t n, int reps, Kernels kernels) {
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  // Random operands from a generator of our own: the run's default generator (legacy Dion's
  // sketches, a resumed run's restored state) must not move.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  const at::Tensor a = at::randn({n, n}, gen, at::kFloat).to(opts), b = at::randn({n, n}, gen, at::kFloat).to(opts);
  auto sync = [&] {
    if (device.is_cuda()) at::accelerator::synchronizeDevice(device.has_index() ? device.index() : 0);
  };
  at::Tensor out = matmul_2d(a, b, kernels);  // warm-up (library handles, workspaces, clocks)
  sync();
  double best = 1e300;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    out = matmul_2d(a, b, kernels);  // the GEMM the model's linears run (kernels.h)
    sync();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

double measure_peak_flops(const c10::Device& device, c10::ScalarType dtype, Kernels kernels) {
  return device.is_cuda() ? measure_matmul_flops(device, dtype, 8192, 10, kernels)
                          : measure_matmul_flops(device, dtype, 1024, 10, kernels);
}

}  // namespace dion::train
