// Symmetric products by lower block rows plus a mirror (see include/dion/math/symmetric.h).
#include "dion/math/symmetric.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "dion/cuda/symmetric.h"
#include "dion/math/ortho.h"
#include "dion/math/own_kernels.h"

namespace dion::math {

namespace {

void check_product(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S) {
  TORCH_CHECK(P.dim() == 3 && P.size(1) == P.size(2) && P.is_contiguous(),
              "symmetric_product_out: P must be a contiguous batch of square matrices [B, m, m], got ", P.sizes());
  TORCH_CHECK(M1.dim() == 3 && M2.dim() == 3 && M1.size(0) == P.size(0) && M2.size(0) == P.size(0) &&
                  M1.size(1) == P.size(1) && M2.size(2) == P.size(2) && M1.size(2) == M2.size(1),
              "symmetric_product_out: shapes do not chain: P ", P.sizes(), " = M1 ", M1.sizes(), " @ M2 ", M2.sizes());
  TORCH_CHECK(!S.defined() || S.sizes() == P.sizes(), "symmetric_product_out: S ", S.sizes(), " must have P's shape ",
              P.sizes());
  TORCH_CHECK(M1.scalar_type() == P.scalar_type() && M2.scalar_type() == P.scalar_type(),
              "symmetric_product_out: M1, M2 and P must share a dtype");
}

// Strictly upper triangle of one m x m matrix from its strictly lower one, rows [row0, row1)
// of the lower part. 8 x 8 micro-tiles: a read touches 8 source lines and a write 8
// destination lines, which stay in L1 even for power-of-two row strides (a 64 x 64 tile with a
// 4 KiB stride maps all its 64 destination lines to one L1 set, measured 10x slower).
template <typename T>
void mirror_rows(T* p, int64_t m, int64_t row0, int64_t row1) {
  constexpr int64_t kMicro = 8;
  T tile[kMicro][kMicro];
  for (int64_t i0 = row0; i0 < row1; i0 += kMicro) {
    const int64_t ni = std::min(kMicro, row1 - i0);
    for (int64_t j0 = 0; j0 < i0 + ni; j0 += kMicro) {
      const int64_t nj = std::min(kMicro, i0 + ni - j0);
      for (int64_t a = 0; a < ni; ++a)
        for (int64_t b = 0; b < nj; ++b) tile[a][b] = p[(i0 + a) * m + j0 + b];
      for (int64_t b = 0; b < nj; ++b)
        for (int64_t a = 0; a < ni; ++a)
          if (j0 + b < i0 + a) p[(j0 + b) * m + i0 + a] = tile[a][b];  // strictly lower only
    }
  }
}

template <typename T>
void mirror_batch(const at::Tensor& P, int64_t from_row) {
  const int64_t batch = P.size(0), m = P.size(1);
  T* base = static_cast<T*>(P.data_ptr());
  constexpr int64_t kRowsPerTask = 64;
  const int64_t tasks_per_matrix = (m - from_row + kRowsPerTask - 1) / kRowsPerTask;
  if (tasks_per_matrix <= 0) return;
  at::parallel_for(0, batch * tasks_per_matrix, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / tasks_per_matrix, r = t % tasks_per_matrix;
      const int64_t row0 = from_row + r * kRowsPerTask;
      mirror_rows(base + b * m * m, m, row0, std::min(row0 + kRowsPerTask, m));
    }
  });
}

// Calls fn(i0, end) for the block rows [i0, end) of an m-row result, `rows` rows each, a short
// last block (< rows / 2) merged into the one before it.
template <typename Fn>
void for_each_block_row(int64_t m, int64_t rows, Fn&& fn) {
  for (int64_t i0 = 0; i0 < m; i0 += rows) {
    const int64_t i1 = std::min(i0 + rows, m);
    const int64_t end = (m - i1 < rows / 2) ? m : i1;
    fn(i0, end);
    if (end == m) break;
  }
}

// P = beta * S + alpha * M1 @ M2 as one batched product (the reference's operation).
void full_product(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S, double beta,
                  double alpha) {
  at::Tensor out = P;  // the _out functions take a non-const handle
  if (S.defined() && beta != 0.0) {
    at::baddbmm_out(out, S, M1, M2, beta, alpha);
  } else {
    at::bmm_out(out, M1, M2);
    if (alpha != 1.0) out.mul_(alpha);
  }
}

// CPU: block rows of the lower triangle, one 2-D product per block row and matrix: a 3-D slice
// of P as the output of bmm takes a slow path in ATen on CPU (measured 3-5x), the 2-D addmm_out
// writes in place.
void cpu_block_rows(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S, double beta,
                    double alpha) {
  const int64_t batch = P.size(0), m = P.size(1);
  for (int64_t b = 0; b < batch; ++b) {
    const at::Tensor p = P[b], m1 = M1[b], m2 = M2[b];
    for_each_block_row(m, kSymmetricBlockRows, [&](int64_t i0, int64_t end) {
      at::Tensor out = p.slice(0, i0, end).slice(1, 0, end);  // [rows, end]
      const at::Tensor a = m1.slice(0, i0, end);              // [rows, k]
      const at::Tensor c = m2.slice(1, 0, end);               // [k, end]
      if (S.defined() && beta != 0.0) {
        at::addmm_out(out, S[b].slice(0, i0, end).slice(1, 0, end), a, c, beta, alpha);
      } else {
        at::mm_out(out, a, c);
        if (alpha != 1.0) out.mul_(alpha);
      }
    });
  }
}

// Batched block rows (the CUDA path): one 3-D product per block row over the whole batch. On
// CUDA at::baddbmm_out hands the strided slice of P to cuBLAS as it is (row stride m, batch
// stride m^2): nothing is copied.
void batched_block_rows(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S,
                        double beta, double alpha, int64_t rows) {
  const int64_t m = P.size(1);
  for_each_block_row(m, rows, [&](int64_t i0, int64_t end) {
    at::Tensor out = P.slice(1, i0, end).slice(2, 0, end);  // [B, rows, end]
    const at::Tensor a = M1.slice(1, i0, end);              // [B, rows, k]
    const at::Tensor c = M2.slice(2, 0, end);               // [B, k, end]
    if (S.defined() && beta != 0.0) {
      at::baddbmm_out(out, S.slice(1, i0, end).slice(2, 0, end), a, c, beta, alpha);
    } else {
      at::bmm_out(out, a, c);
      if (alpha != 1.0) out.mul_(alpha);
    }
  });
}

}  // namespace

int64_t cuda_symmetric_block_rows(int64_t batch, int64_t m, int64_t multiprocessors) {
  if (m < kCudaSymmetricMinRows || batch <= 0 || multiprocessors <= 0) return 0;
  const int64_t tile = kCudaSymmetricTile;
  const int64_t min_rows = (m + kCudaSymmetricMaxBlocks - 1) / kCudaSymmetricMaxBlocks;
  int64_t tiles = std::max<int64_t>(1, (min_rows + tile - 1) / tile);  // block height in tiles
  while (batch * tiles * tiles < multiprocessors) ++tiles;             // the first block row fills one wave
  const int64_t rows = tiles * tile;
  // At least two block rows once a short last block (< rows / 2) is merged.
  return m - rows >= rows / 2 ? rows : 0;
}

void mirror_lower_to_upper_with_aten_ops(const at::Tensor& P, int64_t from_row) {
  TORCH_CHECK(P.dim() == 3 && P.size(1) == P.size(2) && P.is_contiguous(),
              "mirror_lower_to_upper_with_aten_ops: expected a contiguous batch [B, m, m], got ", P.sizes());
  TORCH_CHECK(from_row >= 0, "mirror_lower_to_upper_with_aten_ops: from_row must be >= 0, got ", from_row);
  const int64_t m = P.size(1);
  if (P.numel() == 0 || from_row >= m) return;
  // Destination (j, i) with j < i and i >= from_row takes the source (i, j): P^T there.
  const at::Tensor idx = at::arange(m, P.options().dtype(at::kLong));
  const at::Tensor row = idx.unsqueeze(1), col = idx.unsqueeze(0);
  at::Tensor mask = row < col;  // [m, m], strictly upper
  if (from_row > 0) mask = mask.logical_and(col >= from_row);
  P.copy_(at::where(mask, P.mT(), P));  // where() writes a new tensor: P is read whole first
}

void mirror_lower_to_upper(const at::Tensor& P, int64_t from_row) {
  if (P.is_cuda()) {
    if (own_mirror_kernel(P))
      cuda::mirror_lower_to_upper_(P, from_row);
    else
      mirror_lower_to_upper_with_aten_ops(P, from_row);
    return;
  }
  TORCH_CHECK(P.dim() == 3 && P.size(1) == P.size(2) && P.is_contiguous() && P.device().is_cpu(),
              "mirror_lower_to_upper: expected a contiguous CPU or CUDA batch [B, m, m], got ", P.sizes(), " on ",
              P.device());
  switch (P.element_size()) {  // a copy of bits: only the element size matters
    case 2:
      mirror_batch<uint16_t>(P, from_row);
      break;
    case 4:
      mirror_batch<uint32_t>(P, from_row);
      break;
    case 8:
      mirror_batch<uint64_t>(P, from_row);
      break;
    default:
      TORCH_CHECK(false, "mirror_lower_to_upper: unsupported dtype ", P.scalar_type());
  }
}

// fp32 copies of a product's operands, each distinct memory converted once: an operand that is
// an earlier one or its transpose (X and X^T of a Gram matrix; A, A, A of b A + c A A) is that
// copy, viewed alike, so the GEMM sees the layouts the half operands had.
static std::vector<at::Tensor> to_fp32_once(std::initializer_list<at::Tensor> operands) {
  std::vector<at::Tensor> src, out;
  for (const at::Tensor& t : operands) {
    at::Tensor f;
    for (size_t i = 0; i < src.size() && t.defined() && !f.defined(); ++i) {
      if (!src[i].defined() || src[i].data_ptr() != t.data_ptr()) continue;  // (data_ptr includes the offset)
      if (src[i].sizes() == t.sizes() && src[i].strides() == t.strides()) f = out[i];
      else if (src[i].mT().sizes() == t.sizes() && src[i].mT().strides() == t.strides()) f = out[i].mT();
    }
    if (!f.defined() && t.defined()) f = t.to(at::kFloat);
    src.push_back(t);
    out.push_back(f);
  }
  return out;
}

bool half_product_in_fp32(const at::Tensor& out) {
  const at::ScalarType dt = out.scalar_type();
  return out.device().is_cpu() && (dt == at::kBFloat16 || dt == at::kHalf) && !cpu_has_native_gemm(dt);
}

void symmetric_product_out(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S,
                           double beta, double alpha, bool tiled) {
  check_product(P, M1, M2, S);
  if (half_product_in_fp32(P)) {
    const at::Tensor P32 = at::empty(P.sizes(), P.options().dtype(at::kFloat));
    const std::vector<at::Tensor> f = to_fp32_once({M1, M2, S});
    symmetric_product_out(P32, f[0], f[1], f[2], beta, alpha, tiled);
    P.copy_(P32);
    return;
  }
  const int64_t batch = P.size(0), m = P.size(1);
  const int64_t k = M1.size(2);
  if (tiled && P.device().is_cpu() &&
      (m >= kSymmetricMinRows || (m >= kSymmetricMinRowsLongK && k >= kSymmetricLongK))) {
    cpu_block_rows(P, M1, M2, S, beta, alpha);
    mirror_lower_to_upper(P);
    return;
  }
  // CUDA: block rows plus the mirror kernel only with the own kernels on (dion/math/own_kernels.h;
  // multiprocessor_count is 0 without CUDA kernels); else one full product, cuBLAS through ATen.
  if (tiled && own_mirror_kernel(P)) {
    const int64_t rows = cuda_symmetric_block_rows(batch, m, cuda::multiprocessor_count(P.device().index()));
    if (rows > 0) {
      batched_block_rows(P, M1, M2, S, beta, alpha, rows);
      mirror_lower_to_upper(P);
      return;
    }
  }
  full_product(P, M1, M2, S, beta, alpha);
}

void symmetric_product_block_rows_out(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2,
                                      const at::Tensor& S, double beta, double alpha, int64_t block_rows) {
  check_product(P, M1, M2, S);
  TORCH_CHECK(block_rows > 0, "symmetric_product_block_rows_out: block_rows must be > 0, got ", block_rows);
  batched_block_rows(P, M1, M2, S, beta, alpha, block_rows);
  mirror_lower_to_upper(P);
}

void gram_out(const at::Tensor& P, const at::Tensor& X, bool tiled) {
  symmetric_product_out(P, X, X.mT(), at::Tensor(), 0.0, 1.0, tiled);
}

void batched_product_out(const at::Tensor& out, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S,
                         double beta, double alpha) {
  TORCH_CHECK(out.dim() == 3 && out.is_contiguous() && M1.dim() == 3 && M2.dim() == 3 && M1.size(0) == out.size(0) &&
                  M2.size(0) == out.size(0) && M1.size(2) == M2.size(1) && out.size(1) == M1.size(1) &&
                  out.size(2) == M2.size(2),
              "batched_product_out: shapes do not chain: out ", out.sizes(), " = M1 ", M1.sizes(), " @ M2 ", M2.sizes());
  if (half_product_in_fp32(out)) {
    const at::Tensor out32 = at::empty(out.sizes(), out.options().dtype(at::kFloat));
    const std::vector<at::Tensor> f = to_fp32_once({M1, M2, S});
    full_product(out32, f[0], f[1], f[2], beta, alpha);
    out.copy_(out32);
    return;
  }
  full_product(out, M1, M2, S, beta, alpha);
}

}  // namespace dion::math
