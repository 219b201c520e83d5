// The switch of the project's own CUDA kernels (see include/dion/math/own_kernels.h).
#include "dion/math/own_kernels.h"

#include <atomic>

#include "dion/cuda/fused.h"

namespace dion::math {

namespace {
std::atomic<bool> g_own_cuda_kernels{false};
thread_local int t_override = -1;  // -1: none; else the innermost scope's setting
}  // namespace

void set_own_cuda_kernels(bool on) { g_own_cuda_kernels.store(on, std::memory_order_relaxed); }

bool use_own_cuda_kernels() {
  return t_override >= 0 ? t_override == 1 : g_own_cuda_kernels.load(std::memory_order_relaxed);
}

OwnCudaKernelsScope::OwnCudaKernelsScope(bool on) : previous_(t_override) { t_override = on ? 1 : 0; }

OwnCudaKernelsScope::~OwnCudaKernelsScope() { t_override = previous_; }

bool own_fused_kernel(const at::Tensor& A, const at::Tensor& B) {
  return use_own_cuda_kernels() && cuda::fusable(A, B);
}

bool own_mirror_kernel(const at::Tensor& P) {
  return use_own_cuda_kernels() && cuda::available() && P.defined() && P.is_cuda();
}

}  // namespace dion::math
