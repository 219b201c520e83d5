// src/train/model/transpose_cpu.h — a sum of two fp32 matrices written transposed, on the CPU
// (private to src/train/model; the fast kind's chunked loss, kernels.cpp, uses it for the lm_head's
// weight gradient).
//
//   transpose_sum_into(out [M, N], a [N, M], b [N, M]): out = (a + b)^T. Each entry is one fp32
//     add, as ATen's (a + b).t() (the same bits); a, b and out contiguous CPU fp32 tensors.
//   transpose_sum_kernel_available(): whether the AVX-512 kernel runs (cpu_isa.h's
//     cpu_avx512_kernels(); ATEN_CPU_CAPABILITY=avx2, as scripts/test_avx2.sh sets, turns it off);
//     elsewhere transpose_sum_into is ATen's add and copy.
//
// Why a kernel of our own: the chunked loss accumulates dW^T [C, V] and hands autograd dW [V, C].
// ATen's add, then copy_ of the transposed view: 10.5 ms a step at C = 128, V = 50304 on a Zen 4
// (one thread), where a copy of that matrix takes 2.4. Here 16 x 16 tiles, each row of a tile
// read and summed as one vector and the tile transposed in registers (unpack and shuffle), in
// column blocks of a whose output rows stay in L2 while every row of a passes over them.
#pragma once

#include <ATen/core/Tensor.h>

namespace dion::train {

bool transpose_sum_kernel_available();
void transpose_sum_into(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

}  // namespace dion::train
