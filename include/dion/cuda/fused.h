// dion/cuda/fused.h — fused CUDA kernels for the optimizers' element-wise pre and post steps.
//
//   dion::cuda::available()                      compiled with CUDA kernels (DION_HAVE_CUDA)
//   dion::cuda::fusable(A, B)                    a kernel here can take A and B: available(), both
//                                                contiguous CUDA tensors of one shape on one
//                                                device, float32 or bfloat16
//   dion::cuda::decay_and_update_(X, U, decay, neg_lr)
//       X.mul_(decay); X.add_(U * neg_lr) in one pass (U * neg_lr rounded to U's dtype, then
//       added; each step rounded to its ATen result dtype, no FMA contraction): bit-identical
//       to that ATen composition on the GPU. The unfused form is three kernels and an
//       intermediate tensor (7 memory passes; this one: 3).
//   dion::cuda::momentum_(M, G, U, mu, nesterov)
//       g = G.to(M's dtype); M.mul_(mu).add_(g); and when U is defined,
//       U = nesterov ? M * mu + g : M, stored in U's dtype (the comm dtype): Muon's momentum
//       and update in one pass, bit-identical to that ATen composition.
//
// dion::math (muon_pre / muon_post, dion2_post_masked) calls these for CUDA tensors when
// fusable() and the own kernels are turned on (dion/math/own_kernels.h; off by default: ATen's
// ops until a GPU has checked them); on CPU (or without CUDA) it uses the ATen ops. While they
// are off, a direct call throws c10::Error saying how to turn them on (so does
// mirror_lower_to_upper_ of dion/cuda/symmetric.h).
//   dion::cuda::own_kernel_launches()            launches of this header's and symmetric.h's
//                                                kernels in this process (a test counts them) Calling a kernel in a build without CUDA throws
// std::runtime_error; bad arguments throw c10::Error naming them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::cuda {

bool available();

bool fusable(const at::Tensor& A, const at::Tensor& B);

void decay_and_update_(const at::Tensor& X, const at::Tensor& U, float decay, float neg_lr);
// The same with decay and neg_lr read from 0-d float32 tensors on X's device when the kernel runs
// (a CUDA graph replay reads their current values; dion/math/rates.h).
void decay_and_update_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& decay, const at::Tensor& neg_lr);

void momentum_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& U, float mu, bool nesterov);

int64_t own_kernel_launches();

// The compute capability's major version of CUDA device `device_index` (-1: the current one);
// -1 when unknown (a build without CUDA kernels). bf16 tensor cores: 8 and above.
int compute_capability_major(int device_index = -1);

namespace detail {
void count_launch();  // called by every kernel launch of src/cuda
// Throws c10::Error naming `fn` and the switches unless dion::math::use_own_cuda_kernels(): every
// kernel entry point calls it, so no call site can run a kernel while they are off.
void require_turned_on(const char* fn);
// The storage of dion/math/own_kernels.h's setting (here, below the math layer, so that the
// kernels can check it): the process-wide value, and this thread's override (-1: none).
void set_process_wide(bool on);
bool turned_on();
int exchange_thread_override(int value);  // returns the previous override
}  // namespace detail

}  // namespace dion::cuda
