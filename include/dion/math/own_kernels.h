// dion/math/own_kernels.h — whether the math runs the project's own CUDA kernels.
//
// The project's CUDA kernels — the fused element-wise steps of dion/cuda/fused.h (Muon's
// momentum and decay + update, Dion2's masked update) and the mirror kernel of the symmetric
// products (dion/cuda/symmetric.h) — have not run on a GPU yet. Until scripts/device_check.sh
// has checked them on one, CUDA tensors take ATen's own CUDA ops by default: the element-wise
// compositions the kernels are meant to equal, and one full batched product (cuBLAS) for every
// symmetric product. The kernels run only when a setting turns them on:
//   dion::math::set_own_cuda_kernels(true)   process-wide (Python: dion_cpp._C.set_cuda_kernels)
//   dion::math::OwnCudaKernelsScope on(true) this thread, until the scope ends (scopes nest;
//                                            a scope wins over the process-wide setting)
//   math::OrthoConfig::cuda_kernels = true   one optimizer: its step() (the orthogonalization
//                                            included) runs inside such a scope
//   dion-train: key cuda_kernels             (docs/train.md)
// The device check runs the GPU tests and benchmarks with the kernels on and off; its results
// are what may later make them the default. CPU tensors are never affected (the CPU kernels of
// dion/math/elementwise.h have their own switch, DION_DISABLE_FUSED).
//
// The decisions read tensor metadata only (never the device), so a CPU test can ask them about a
// tensor that only describes a CUDA tensor (tests/cuda/test_cuda.cpp, CudaDispatch.*):
//   own_fused_kernel(A, B)   the call sites of dion/cuda/fused.h: use_own_cuda_kernels() and
//                            cuda::fusable(A, B)
//   own_mirror_kernel(P)     the mirror of P is the kernel: P on CUDA, kernels built and on
// cuda::own_kernel_launches() (dion/cuda/fused.h) counts the kernels' launches: the GPU test
// checks that a default optimizer step launches none.
#pragma once

#include <ATen/core/Tensor.h>

namespace dion::math {

// The process-wide setting (default false).
void set_own_cuda_kernels(bool on);
// What the math does now on this thread: the innermost OwnCudaKernelsScope, else the
// process-wide setting.
bool use_own_cuda_kernels();

class OwnCudaKernelsScope {
 public:
  explicit OwnCudaKernelsScope(bool on);
  ~OwnCudaKernelsScope();
  OwnCudaKernelsScope(const OwnCudaKernelsScope&) = delete;
  OwnCudaKernelsScope& operator=(const OwnCudaKernelsScope&) = delete;

 private:
  int previous_;  // the thread's override before this scope: -1 none, 0 off, 1 on
};

bool own_fused_kernel(const at::Tensor& A, const at::Tensor& B);
bool own_mirror_kernel(const at::Tensor& P);

}  // namespace dion::math
