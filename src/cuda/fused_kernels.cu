// Fused element-wise CUDA kernels (see include/dion/cuda/fused.h). Raw pointers only: the ATen
// side (checks, streams) lives in src/cuda/fused.cpp, so nvcc never parses the ATen headers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dion::cuda::detail {

namespace {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// X[i] = decay * X[i] + neg_lr * U[i]; grid-stride loop.
template <typename TX, typename TU>
__global__ void decay_and_update_kernel(TX* x, const TU* u, int64_t n, float decay, float neg_lr) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    store(x, i, decay * load(x, i) + neg_lr * load(u, i));
  }
}

template <typename TX, typename TU>
cudaError_t launch(void* x, const void* u, int64_t n, float decay, float neg_lr, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 65535 ? want : 65535);
  decay_and_update_kernel<TX, TU><<<blocks, threads, 0, stream>>>(static_cast<TX*>(x), static_cast<const TU*>(u), n,
                                                                    decay, neg_lr);
  return cudaGetLastError();
}

}  // namespace

// x_bf16 / u_bf16: element types (false = float32).
cudaError_t decay_and_update(void* x, bool x_bf16, const void* u, bool u_bf16, int64_t n, float decay, float neg_lr,
                             cudaStream_t stream) {
  if (!x_bf16 && !u_bf16) return launch<float, float>(x, u, n, decay, neg_lr, stream);
  if (!x_bf16 && u_bf16) return launch<float, __nv_bfloat16>(x, u, n, decay, neg_lr, stream);
  if (x_bf16 && !u_bf16) return launch<__nv_bfloat16, float>(x, u, n, decay, neg_lr, stream);
  return launch<__nv_bfloat16, __nv_bfloat16>(x, u, n, decay, neg_lr, stream);
}

}  // namespace dion::cuda::detail
