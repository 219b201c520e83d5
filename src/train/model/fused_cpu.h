// src/train/model/fused_cpu.h — the block's elementwise chains as one pass each, forward and
// backward (private to src/train/model; gpt.cpp's fast kind uses them on CPU).
//
//   rotary_fused(x [B, T, H, D], cos [T, D/2], sin [T, D/2]) = apply_rotary(x, cos, sin):
//     y1 = x1 c + x2 s, y2 = x1 (-s) + x2 c over the halves x1, x2 of the last dim;
//     backward dx1 = dy1 c + dy2 (-s), dx2 = dy1 s + dy2 c.
//   relu_square_fused(a) = relu(a)^2; backward da = a > 0 ? dy (2 relu(a)) : 0.
//   rms_norm_fused(x) = F.rms_norm(x, (x.size(-1),)) with eps = finfo(fp32).eps, as the exact
//     kind's at::rms_norm takes for fp32 and bf16 rows: one pass forward (the row's sum of squares, then y = x r), one
//     backward, r = 1 / sqrt(mean x^2 + eps) kept per row.
//
// Each is one autograd node that reads its inputs once and writes its output once. ATen's
// composition makes ~10 passes for the rotary (two slices, four products, two sums, a cat, and
// their backward with two zero-filled slice gradients) and ~6 for relu^2 (relu, pow; backward's
// 2 r, the product, the threshold), each a [B, T, C]-sized or [B, T, 4C]-sized stream.
//
// The rotary's and relu^2's arithmetic is ATen's, operation by operation, rounded after each as ATen rounds: fp32
// without fused multiply-adds (the build's -ffp-contract=off), bf16 with every product and sum
// rounded to bf16 (nearest even), cos and sin read as fp32 (exact from bf16). So the results
// equal the composition's bit for bit (tests/train/model/test_fused_cpu.cpp), a NaN's payload
// aside. The RMSNorm computes in fp32 like ATen's (which upcasts bf16) but sums a row's squares in
// another order: equal to fp32 rounding, and in bf16 to one bf16 rounding step. Inputs: CPU, fp32 or bf16, x and dy any strides (made contiguous); rows run in
// parallel (at::parallel_for), each element computed alone, so any thread count gives the same
// bits. Elsewhere (CUDA, other dtypes) fused_available is false and callers take ATen's ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dion::train {

// True for a CPU tensor of fp32 or bf16 (the RMSNorm and relu^2 take it).
bool fused_available(const at::Tensor& x);
// The rotary's: x and cos on the CPU in fp32 or bf16, and a bf16 x with bf16 cos/sin (ATen rounds
// a bf16 x with fp32 tables once, at the end, which this kernel does not).
bool rotary_fused_available(const at::Tensor& x, const at::Tensor& cos);

at::Tensor rotary_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor relu_square_fused(const at::Tensor& a);
at::Tensor rms_norm_fused(const at::Tensor& x);

// The MoE's dispatch and combine over fp32 rows on the CPU (rows_fused_available), one autograd
// node each:
//   gather_rows_fused(x [N, C], index [R]) = x.index_select(0, index); backward scatter-adds the
//     rows' gradient into a zero [N, C] in row order (ATen's index_select backward: the same bits);
//   weighted_scatter_rows_fused(rows [R, C], w [R], index [R], n, plus) = zeros [n, C] with
//     y[index[i]] += rows[i] w[i] in row order, then + plus [n, C] when given (ATen's
//     zeros().index_add(0, index, rows * w[:, None]) + plus: the same bits); backward in one pass
//     over the rows: drows[i] = dy[index[i]] w[i] (the same bits), dw[i] = dy[index[i]] . rows[i]
//     (summed in another order than ATen's: fp32 rounding), dplus = dy.
// Both sums run target by target, each output row written once (its rows found by a stable
// counting sort of the index). Replaced: ATen's index_add, which sorts the index and zero-fills,
// the products', the sum's and plus's separate passes over [R, C] or [n, C].
bool rows_fused_available(const at::Tensor& x);
// A stable counting sort of index [R] (values in [0, N)): target t's rows are
// rows[ptr[t] .. ptr[t + 1]), ascending. Out-of-range values throw, naming `what`.
struct RowsByTarget {
  std::vector<int64_t> ptr, rows;
};
RowsByTarget rows_by_target(const int64_t* index, int64_t R, int64_t N, const char* what);
at::Tensor gather_rows_fused(const at::Tensor& x, const at::Tensor& index);
at::Tensor weighted_scatter_rows_fused(const at::Tensor& rows, const at::Tensor& w, const at::Tensor& index,
                                       int64_t n, const at::Tensor& plus = {});

// relu^2's two passes without autograd, for autograd functions of their own (the MoE's grouped
// experts): out = relu(a)^2, and out = d(relu(a)^2)/da * dy. a and out contiguous, one shape.
void relu_square_out(const at::Tensor& a, const at::Tensor& out);
void relu_square_grad_out(const at::Tensor& a, const at::Tensor& dy, const at::Tensor& out);

}  // namespace dion::train
