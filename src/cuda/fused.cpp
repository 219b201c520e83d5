// ATen side of the fused CUDA kernels (see include/dion/cuda/fused.h): argument checks and the
// current stream. Compiled into the library in every build; the kernels only with DION_HAVE_CUDA.
#include "dion/cuda/fused.h"

#include <ATen/ATen.h>

#include <atomic>
#include <stdexcept>
#include <string>

#ifdef DION_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace dion::cuda::detail {
cudaError_t decay_and_update(void* x, bool x_bf16, const void* u, bool u_bf16, int64_t n, float decay, float neg_lr,
                             const float* decay_p, const float* neg_lr_p, cudaStream_t stream);
cudaError_t momentum(void* m, bool m_bf16, const void* g, bool g_bf16, void* u, bool u_bf16, int64_t n, float mu,
                     bool nesterov, bool write_u, cudaStream_t stream);
}  // namespace dion::cuda::detail
#endif

namespace dion::cuda {

namespace {

bool float_or_bf16(const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; }

}  // namespace

namespace {
std::atomic<bool> g_own_kernels{false};
thread_local int t_override = -1;  // -1: none; else the innermost OwnCudaKernelsScope's setting
}  // namespace

void detail::set_process_wide(bool on) { g_own_kernels.store(on, std::memory_order_relaxed); }

bool detail::turned_on() { return t_override >= 0 ? t_override == 1 : g_own_kernels.load(std::memory_order_relaxed); }

int detail::exchange_thread_override(int value) {
  const int previous = t_override;
  t_override = value;
  return previous;
}

void detail::require_turned_on(const char* fn) {
  TORCH_CHECK(detail::turned_on(), fn,
              ": the project's own CUDA kernels are off (the default until a GPU has checked them); turn them on "
              "with dion::math::set_own_cuda_kernels(true), an OwnCudaKernelsScope, OrthoConfig::cuda_kernels or "
              "dion-train's cuda_kernels key (dion/math/own_kernels.h)");
}

namespace {

void check_pair(const char* fn, const char* a_name, const at::Tensor& A, const char* b_name, const at::Tensor& B) {
  TORCH_CHECK(A.is_cuda() && B.is_cuda() && A.device() == B.device(), fn, ": ", a_name, " and ", b_name,
              " must be CUDA tensors on one device, got ", A.device(), " and ", B.device());
  TORCH_CHECK(A.sizes() == B.sizes(), fn, ": shapes differ: ", a_name, " ", A.sizes(), ", ", b_name, " ", B.sizes());
  TORCH_CHECK(A.is_contiguous() && B.is_contiguous(), fn, ": ", a_name, " and ", b_name, " must be contiguous");
  TORCH_CHECK(float_or_bf16(A) && float_or_bf16(B), fn, ": dtypes must be float32 or bfloat16, got ", A.scalar_type(),
              " and ", B.scalar_type());
}

#ifdef DION_HAVE_CUDA
bool bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }
#else
[[noreturn]] void no_kernels(const char* fn) {
  throw std::runtime_error(std::string(fn) +
                           ": dion-cpp was built without CUDA kernels (torch without CUDA or no nvcc)");
}
#endif

}  // namespace

namespace {
std::atomic<int64_t> g_launches{0};
}  // namespace

int64_t own_kernel_launches() { return g_launches.load(std::memory_order_relaxed); }

void detail::count_launch() { g_launches.fetch_add(1, std::memory_order_relaxed); }

int compute_capability_major(int device_index) {
#ifdef DION_HAVE_CUDA
  int device = device_index;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return -1;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return -1;
  return major;
#else
  (void)device_index;
  return -1;
#endif
}

bool available() {
#ifdef DION_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool fusable(const at::Tensor& A, const at::Tensor& B) {
  return available() && A.defined() && B.defined() && A.is_cuda() && B.is_cuda() && A.device() == B.device() &&
         A.sizes() == B.sizes() && A.is_contiguous() && B.is_contiguous() && float_or_bf16(A) && float_or_bf16(B);
}

namespace {
void decay_and_update_impl(const at::Tensor& X, const at::Tensor& U, float decay, float neg_lr, const float* decay_p,
                           const float* neg_lr_p) {
#ifdef DION_HAVE_CUDA
  detail::count_launch();
  const cudaError_t err =
      detail::decay_and_update(X.data_ptr(), bf16(X), U.data_ptr(), bf16(U), X.numel(), decay, neg_lr, decay_p,
                               neg_lr_p, c10::cuda::getCurrentCUDAStream(X.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "decay_and_update_: CUDA error: ", cudaGetErrorString(err));
#else
  (void)X, (void)U, (void)decay, (void)neg_lr, (void)decay_p, (void)neg_lr_p;
  no_kernels("decay_and_update_");
#endif
}
}  // namespace

void decay_and_update_(const at::Tensor& X, const at::Tensor& U, float decay, float neg_lr) {
  check_pair("decay_and_update_", "X", X, "U", U);
  detail::require_turned_on("decay_and_update_");
  decay_and_update_impl(X, U, decay, neg_lr, nullptr, nullptr);
}

void decay_and_update_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& decay, const at::Tensor& neg_lr) {
  check_pair("decay_and_update_", "X", X, "U", U);
  for (const at::Tensor* s : {&decay, &neg_lr})
    TORCH_CHECK(s->defined() && s->dim() == 0 && s->scalar_type() == at::kFloat && s->device() == X.device(),
                "decay_and_update_: decay and neg_lr must be 0-d float32 tensors on ", X.device(), ", got ",
                s->defined() ? s->toString() : std::string("undefined"), " on ",
                s->defined() ? s->device().str() : std::string("-"));
  detail::require_turned_on("decay_and_update_");
  decay_and_update_impl(X, U, 0.0f, 0.0f, decay.const_data_ptr<float>(), neg_lr.const_data_ptr<float>());
}

void momentum_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& U, float mu, bool nesterov) {
  check_pair("momentum_", "M", M, "G", G);
  if (U.defined()) check_pair("momentum_", "M", M, "U", U);
  detail::require_turned_on("momentum_");
#ifdef DION_HAVE_CUDA
  detail::count_launch();
  const cudaError_t err = detail::momentum(
      M.data_ptr(), bf16(M), G.data_ptr(), bf16(G), U.defined() ? U.data_ptr() : nullptr, U.defined() && bf16(U),
      M.numel(), mu, nesterov, U.defined(), c10::cuda::getCurrentCUDAStream(M.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "momentum_: CUDA error: ", cudaGetErrorString(err));
#else
  (void)mu;
  (void)nesterov;
  no_kernels("momentum_");
#endif
}

}  // namespace dion::cuda
