// dion/train/mfu.h — model FLOPs utilization (MFU) of a training run: the FLOPs the model needs
// per token times the tokens per second, over the device's peak FLOP/s.
//
//   flops per token = 6 N + 12 L T C     (PaLM, Chowdhery et al. 2022, App. B: forward and
//                                          backward of every weight, plus attention's QK^T and AV)
//   N: parameter count (gpt_param_count), L layers, T sequence length, C model width.
//   MFU = flops_per_token * tokens_per_s / peak_flops
// The peak is the config's peak_tflops, or measured once: the best of a few square matmuls in
// the run's compute dtype (bf16 under autocast, else fp32) on the run's device. A measured peak
// makes MFU a fraction of what this device does on a large GEMM (a CPU's too), not of a
// datasheet figure. Not here: timing the steps (train.cpp).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

#include "dion/train/gpt.h"

namespace dion::train {

double flops_per_token(const GPTConfig& config);

// FLOP/s of an n x n x n matmul (2 n^3 flops) of `dtype` on `device`, computed as the model's
// linears compute (matmul_2d with `kernels`, dion/train/kernels.h): the best of `reps` timed runs
// after one warm-up (synchronized on CUDA).
double measure_matmul_flops(const c10::Device& device, c10::ScalarType dtype, int64_t n, int reps,
                            Kernels kernels = Kernels::exact);

// The peak a run measures when peak_tflops is 0: n = 8192 on CUDA (best of 10), 1024 on CPU (best
// of 10: a fraction of a second on two cores; the best of several, so that other processes' load
// during the measurement matters less), with the run's kernels (the fast kind's oneDNN fp32
// GEMM is 2-2.5x ATen's on some CPUs: an ATen peak would put MFU above 100%). The operands come
// from a generator of its own (the run's stays put).
double measure_peak_flops(const c10::Device& device, c10::ScalarType dtype, Kernels kernels = Kernels::exact);

// MFU as a fraction (0.42 = 42%).
inline double mfu(double flops_per_token, double tokens_per_s, double peak_flops) {
  return peak_flops > 0 ? flops_per_token * tokens_per_s / peak_flops : 0.0;
}

}  // namespace dion::train
