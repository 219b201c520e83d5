// ATen side of the fused CUDA kernels (see include/dion/cuda/fused.h): argument checks and the
// current stream. Compiled into the library in every build; the kernels only with DION_HAVE_CUDA.
#include "dion/cuda/fused.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#ifdef DION_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace dion::cuda::detail {
cudaError_t decay_and_update(void* x, bool x_bf16, const void* u, bool u_bf16, int64_t n, float decay, float neg_lr,
                             cudaStream_t stream);
}  // namespace dion::cuda::detail
#endif

namespace dion::cuda {

bool available() {
#ifdef DION_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void decay_and_update_(at::Tensor& X, const at::Tensor& U, float decay, float neg_lr) {
  TORCH_CHECK(X.is_cuda() && U.is_cuda(), "decay_and_update_: X and U must be CUDA tensors, got ", X.device(),
              " and ", U.device());
  TORCH_CHECK(X.sizes() == U.sizes(), "decay_and_update_: shapes differ: X ", X.sizes(), ", U ", U.sizes());
  TORCH_CHECK(X.is_contiguous() && U.is_contiguous(), "decay_and_update_: X and U must be contiguous");
  auto ok = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; };
  TORCH_CHECK(ok(X.scalar_type()) && ok(U.scalar_type()), "decay_and_update_: dtypes must be float32 or bfloat16, got ",
              X.scalar_type(), " and ", U.scalar_type());
#ifdef DION_HAVE_CUDA
  const cudaError_t err = detail::decay_and_update(X.data_ptr(), X.scalar_type() == at::kBFloat16, U.data_ptr(),
                                                   U.scalar_type() == at::kBFloat16, X.numel(), decay, neg_lr,
                                                   c10::cuda::getCurrentCUDAStream(X.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "decay_and_update_: CUDA error: ", cudaGetErrorString(err));
#else
  (void)decay;
  (void)neg_lr;
  throw std::runtime_error("decay_and_update_: dion-cpp was built without CUDA kernels (torch without CUDA or no nvcc)");
#endif
}

}  // namespace dion::cuda
