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
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// v rounded to T and back: what an ATen op whose result has dtype T stores (round to nearest
// even, as c10::BFloat16). Each step below rounds where its ATen composition does, and uses the
// _rn intrinsics so that nvcc cannot contract a multiply and an add into one FMA (one rounding
// instead of ATen's two): the kernels are bit-identical to their compositions.
template <typename T>
__device__ __forceinline__ float round_to(float v);
template <>
__device__ __forceinline__ float round_to<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// X.mul_(decay); X.sub_(U * adjusted_lr)   (U * adjusted_lr in U's dtype; neg_lr = -adjusted_lr)
// decay_p / neg_lr_p: when not null, the values are read there (device memory: what a CUDA graph
// replay must re-read) instead of the arguments.
template <typename TX, typename TU>
__global__ void decay_and_update_kernel(TX* x, const TU* u, int64_t n, float decay, float neg_lr, const float* decay_p,
                                        const float* neg_lr_p) {
  if (decay_p) decay = *decay_p;
  if (neg_lr_p) neg_lr = *neg_lr_p;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float xd = round_to<TX>(__fmul_rn(load(x, i), decay));
    const float step = round_to<TU>(__fmul_rn(load(u, i), neg_lr));  // -(U * adjusted_lr), exact negation
    store(x, i, __fadd_rn(xd, step));
  }
}

// g = G.to(M's dtype); M.mul_(mu).add_(g); U = nesterov ? M * mu + g : M, stored in U's dtype
// (write_u false: U is M itself, nothing to write).
template <typename TM, typename TG, typename TU>
__global__ void momentum_kernel(TM* m, const TG* g_in, TU* u, int64_t n, float mu, bool nesterov, bool write_u) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = round_to<TM>(load(g_in, i));
    const float m_new = round_to<TM>(__fadd_rn(round_to<TM>(__fmul_rn(load(m, i), mu)), g));
    store(m, i, m_new);
    if (write_u) store(u, i, nesterov ? round_to<TM>(__fadd_rn(round_to<TM>(__fmul_rn(m_new, mu)), g)) : m_new);
  }
}

int blocks_for(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return static_cast<int>(want < 65535 ? want : 65535);
}

template <typename TX, typename TU>
cudaError_t launch_decay(void* x, const void* u, int64_t n, float decay, float neg_lr, const float* decay_p,
                         const float* neg_lr_p, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  decay_and_update_kernel<TX, TU><<<blocks_for(n, 256), 256, 0, stream>>>(
      static_cast<TX*>(x), static_cast<const TU*>(u), n, decay, neg_lr, decay_p, neg_lr_p);
  return cudaGetLastError();
}

template <typename TM, typename TG, typename TU>
cudaError_t launch_momentum(void* m, const void* g, void* u, int64_t n, float mu, bool nesterov, bool write_u,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  momentum_kernel<TM, TG, TU><<<blocks_for(n, 256), 256, 0, stream>>>(static_cast<TM*>(m), static_cast<const TG*>(g),
                                                                      static_cast<TU*>(u), n, mu, nesterov, write_u);
  return cudaGetLastError();
}

template <typename TM, typename TG>
cudaError_t momentum_u(void* m, const void* g, void* u, bool u_bf16, int64_t n, float mu, bool nesterov, bool write_u,
                       cudaStream_t stream) {
  if (u_bf16) return launch_momentum<TM, TG, __nv_bfloat16>(m, g, u, n, mu, nesterov, write_u, stream);
  return launch_momentum<TM, TG, float>(m, g, u, n, mu, nesterov, write_u, stream);
}

}  // namespace

// x_bf16 / u_bf16: element types (false = float32). decay_p / neg_lr_p: device pointers, or null.
cudaError_t decay_and_update(void* x, bool x_bf16, const void* u, bool u_bf16, int64_t n, float decay, float neg_lr,
                             const float* decay_p, const float* neg_lr_p, cudaStream_t stream) {
  if (!x_bf16 && !u_bf16) return launch_decay<float, float>(x, u, n, decay, neg_lr, decay_p, neg_lr_p, stream);
  if (!x_bf16 && u_bf16) return launch_decay<float, __nv_bfloat16>(x, u, n, decay, neg_lr, decay_p, neg_lr_p, stream);
  if (x_bf16 && !u_bf16) return launch_decay<__nv_bfloat16, float>(x, u, n, decay, neg_lr, decay_p, neg_lr_p, stream);
  return launch_decay<__nv_bfloat16, __nv_bfloat16>(x, u, n, decay, neg_lr, decay_p, neg_lr_p, stream);
}

cudaError_t momentum(void* m, bool m_bf16, const void* g, bool g_bf16, void* u, bool u_bf16, int64_t n, float mu,
                     bool nesterov, bool write_u, cudaStream_t stream) {
  if (!m_bf16 && !g_bf16) return momentum_u<float, float>(m, g, u, u_bf16, n, mu, nesterov, write_u, stream);
  if (!m_bf16 && g_bf16) return momentum_u<float, __nv_bfloat16>(m, g, u, u_bf16, n, mu, nesterov, write_u, stream);
  if (m_bf16 && !g_bf16) return momentum_u<__nv_bfloat16, float>(m, g, u, u_bf16, n, mu, nesterov, write_u, stream);
  return momentum_u<__nv_bfloat16, __nv_bfloat16>(m, g, u, u_bf16, n, mu, nesterov, write_u, stream);
}

}  // namespace dion::cuda::detail
