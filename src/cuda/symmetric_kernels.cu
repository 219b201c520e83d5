// The mirror kernel of the symmetric products (see include/dion/cuda/symmetric.h). Raw pointers
// only: the ATen side (checks, stream) lives in src/cuda/symmetric.cpp, so nvcc never parses the
// ATen headers.
//
// One thread block per 32 x 32 tile (ti, tj) of the lower triangle (tj <= ti) and matrix: it
// reads source tile rows [32 ti, 32 ti + 32) x cols [32 tj, 32 tj + 32) row by row (coalesced),
// then writes its transpose into tile (tj, ti) row by row (coalesced), through shared memory
// padded by one column (no bank conflicts on the transposed read). Only destination elements
// strictly above the diagonal are written; a diagonal tile reads all of itself before writing
// (one __syncthreads), so no thread reads what another writes. Blocks above the diagonal
// return at once (half the grid: 32 x 32 tiles make that a few microseconds at most).
#include <cuda_runtime.h>

#include <cstdint>

namespace dion::cuda::detail {

namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // blockDim = (32, 8): each thread copies 4 elements per tile

template <typename T>
__global__ void mirror_kernel(T* p, int64_t batch, int64_t m, int64_t from_row) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t ti = blockIdx.y, tj = blockIdx.x;
  if (tj > ti) return;  // above the diagonal: nothing to read
  const int64_t row0 = ti * kTile, col0 = tj * kTile;
  if (row0 + kTile <= from_row) return;  // every source row is above from_row
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    T* q = p + b * m * m;
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t i = row0 + r, j = col0 + threadIdx.x;
      if (i < m && j < m) tile[r][threadIdx.x] = q[i * m + j];
    }
    __syncthreads();
    // Destination row j = col0 + r, column i = row0 + threadIdx.x: the value of source (i, j).
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t j = col0 + r, i = row0 + threadIdx.x;
      if (i < m && j < i && i >= from_row) q[j * m + i] = tile[threadIdx.x][r];
    }
    __syncthreads();  // the next matrix reuses the tile
  }
}

template <typename T>
cudaError_t launch(void* p, int64_t batch, int64_t m, int64_t from_row, cudaStream_t stream) {
  const int64_t tiles = (m + kTile - 1) / kTile;
  if (tiles > 65535) return cudaErrorInvalidValue;  // m > 2 million: not a matrix we orthogonalize
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(tiles),
                  static_cast<unsigned>(batch < 65535 ? batch : 65535));
  mirror_kernel<T><<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(static_cast<T*>(p), batch, m, from_row);
  return cudaGetLastError();
}

}  // namespace

// A copy of bits: only the element size matters.
cudaError_t mirror_lower_to_upper(void* p, int element_size, int64_t batch, int64_t m, int64_t from_row,
                                  cudaStream_t stream) {
  if (batch == 0 || m == 0) return cudaSuccess;
  switch (element_size) {
    case 2:
      return launch<uint16_t>(p, batch, m, from_row, stream);
    case 4:
      return launch<uint32_t>(p, batch, m, from_row, stream);
    case 8:
      return launch<uint64_t>(p, batch, m, from_row, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace dion::cuda::detail
