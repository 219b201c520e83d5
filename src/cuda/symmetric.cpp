// ATen side of the symmetric products' CUDA pieces (see include/dion/cuda/symmetric.h):
// argument checks, the current stream, the device's multiprocessor count. Compiled into the
// library in every build; the mirror kernel (symmetric_kernels.cu) only with DION_HAVE_CUDA.
#include "dion/cuda/symmetric.h"

#include "dion/cuda/fused.h"

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <stdexcept>

#ifdef DION_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace dion::cuda::detail {
cudaError_t mirror_lower_to_upper(void* p, int element_size, int64_t batch, int64_t m, int64_t from_row,
                                  cudaStream_t stream);
}  // namespace dion::cuda::detail
#endif

namespace dion::cuda {

void mirror_lower_to_upper_(const at::Tensor& P, int64_t from_row) {
  TORCH_CHECK(P.is_cuda(), "mirror_lower_to_upper_: P must be a CUDA tensor, got one on ", P.device());
  TORCH_CHECK(P.dim() == 3 && P.size(1) == P.size(2) && P.is_contiguous(),
              "mirror_lower_to_upper_: expected a contiguous batch of square matrices [B, m, m], got ", P.sizes());
  TORCH_CHECK(P.element_size() == 2 || P.element_size() == 4 || P.element_size() == 8,
              "mirror_lower_to_upper_: unsupported dtype ", P.scalar_type(), " (2-, 4- or 8-byte elements)");
  TORCH_CHECK(from_row >= 0, "mirror_lower_to_upper_: from_row must be >= 0, got ", from_row);
  detail::require_turned_on("mirror_lower_to_upper_");
#ifdef DION_HAVE_CUDA
  if (P.numel() == 0 || from_row >= P.size(1)) return;
  detail::count_launch();
  const cudaError_t err =
      detail::mirror_lower_to_upper(P.data_ptr(), static_cast<int>(P.element_size()), P.size(0), P.size(1), from_row,
                                    c10::cuda::getCurrentCUDAStream(P.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "mirror_lower_to_upper_: CUDA error: ", cudaGetErrorString(err));
#else
  throw std::runtime_error(
      "mirror_lower_to_upper_: dion-cpp was built without CUDA kernels (torch without CUDA or no nvcc)");
#endif
}

int64_t multiprocessor_count(int device_index) {
#ifdef DION_HAVE_CUDA
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cache{};  // 0: not asked yet
  const bool cached = device_index >= 0 && device_index < kMaxDevices;
  if (cached) {
    const int n = cache[static_cast<size_t>(device_index)].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device_index);
  TORCH_CHECK(err == cudaSuccess, "multiprocessor_count: CUDA error for device ", device_index, ": ",
              cudaGetErrorString(err));
  if (cached) cache[static_cast<size_t>(device_index)].store(n, std::memory_order_relaxed);
  return n;
#else
  (void)device_index;
  return 0;
#endif
}

}  // namespace dion::cuda
