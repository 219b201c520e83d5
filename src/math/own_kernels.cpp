// The switch of the project's own CUDA kernels (see include/dion/math/own_kernels.h).
#include "dion/math/own_kernels.h"

#include "dion/cuda/fused.h"

namespace dion::math {

void set_own_cuda_kernels(bool on) { cuda::detail::set_process_wide(on); }

bool use_own_cuda_kernels() { return cuda::detail::turned_on(); }

OwnCudaKernelsScope::OwnCudaKernelsScope(bool on) : previous_(cuda::detail::exchange_thread_override(on ? 1 : 0)) {}

OwnCudaKernelsScope::~OwnCudaKernelsScope() { cuda::detail::exchange_thread_override(previous_); }

bool own_fused_kernel(const at::Tensor& A, const at::Tensor& B) {
  return use_own_cuda_kernels() && cuda::fusable(A, B);
}

bool own_mirror_kernel(const at::Tensor& P) {
  return use_own_cuda_kernels() && cuda::available() && P.defined() && P.is_cuda();
}

}  // namespace dion::math
