// dion/cuda/symmetric.h — the CUDA pieces of the symmetric products (dion/math/symmetric.h).
//
//   dion::cuda::mirror_lower_to_upper_(P, from_row)
//       P [B, m, m] contiguous on a CUDA device, any 2-, 4- or 8-byte dtype: copies the strictly
//       lower triangle onto the strictly upper one (P[b, j, i] = P[b, i, j] for j < i, source
//       rows i >= from_row), bit for bit, on the current stream: a tiled transpose-copy, 32 x 32
//       tiles through shared memory, only the tiles on or below the diagonal do work. The
//       diagonal and the lower triangle are left as they are. Capturable in a CUDA graph.
//   dion::cuda::multiprocessor_count(device_index)
//       streaming multiprocessors of that CUDA device (cached per device); 0 in a build without
//       CUDA kernels. The block-row heuristic of the symmetric products sizes its blocks by it.
//
// What it is not: the products themselves (cuBLAS through ATen, src/math/symmetric.cpp) or a
// check that P is symmetric. Without CUDA kernels mirror_lower_to_upper_ throws
// std::runtime_error; bad arguments throw c10::Error naming the shape, dtype or device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::cuda {

void mirror_lower_to_upper_(const at::Tensor& P, int64_t from_row = 0);

int64_t multiprocessor_count(int device_index);

}  // namespace dion::cuda
