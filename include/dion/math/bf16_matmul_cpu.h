// dion/math/bf16_matmul_cpu.h — the exact path's bf16 products on CPUs without bf16 GEMMs:
// ATen's own arithmetic, vectorized.
//
// Where a CPU has no AVX-512 (BW, VL, DQ) and no AVX-NE-CONVERT (AMD Zen 3 and older, Intel
// before Skylake-SP; or oneDNN capped below them by ONEDNN_MAX_CPU_ISA), ATen does not hand a
// bf16 matmul to oneDNN: it runs its own loops (cpublas, aten/src/ATen/native/cpu/BlasKernel.cpp),
// one dot product per output, 0.7-11 GFLOP/s against 30-60 for the same CPU's fp32 GEMM. The
// exact path (and the reference, microsoft/dion, on such a CPU) orthogonalizes in bf16 through
// exactly those products. Which loop runs depends on the operands' layout (addmm_impl_cpu_), and
// each sums an output c[i, j] = sum_l a[i, l] b[l, j] in its own fixed order (torch 2.11, AVX2):
//
//   four_way  both operands row-major (gemm_notrans_) or both column-major (gemm_transab_):
//             p[l % 4] += a*b for l < 4 (k / 4), the rest into p[0], then ((p0 + p1) + p2) + p3
//   running   a column-major, b row-major (gemm_transb_; X^T X): one running sum over l
//   dot64     a row-major, b column-major (gemm_transa_; X X^T): ATen's vectorized
//             dot_with_fp32_arith: 64 partial sums (l mod 64) by fused multiply-add over whole
//             blocks of 64, reduced as a tree; 8 (l mod 8) over the next whole blocks of 16,
//             reduced alike and added; the last k mod 16 products added one by one
//
// every partial sum starting at +0, each product rounded to float then added (four_way, running;
// a product of two bf16 values is exact in float unless it falls below float's normal range) and
// the result rounded to bf16 (nearest even). Where equality could fail: if ATen's build fused a
// four_way / running step into an FMA, only a product below float's normal range would round
// differently (tests/math/test_bf16_matmul.cpp's subnormal products found no difference; dot64
// uses FMAs as ATen's fmadd does). bf16_matmul_in_order() computes an order with AVX2,
// eight outputs a lane, so it is bit-identical to ATen's loop at several times its speed
// (docs/benchmarks.md).
//
// exact_matmul(a, b) is at::matmul(a, b) for the exact path: through bf16_matmul_in_order where
// aten_bf16_sum_order(a, b) names the loop ATen would run, ATen's own call everywhere else (fp32,
// GPUs, CPUs with oneDNN's bf16 GEMMs, other layouts, tiny products). Whether this process's ATen
// sums in an order is decided once per order by a probe: at::matmul against bf16_matmul_in_order,
// bit for bit, on operands built so that any other order changes most bf16 results (2-D and
// batched, each layout that runs the loop, k with every kind of remainder). A CPU whose ATen kernels
// are not AVX2's (dot64 has 16 lanes under AVX-512's, a serial lane reduction under the default
// ones) fails it for that order. Where ATen may hand bf16 GEMMs to oneDNN at all
// (aten_bf16_matmul_uses_onednn, dion/math/ortho.h: AVX-512 CPUs unless capped), no order is
// confirmed and every product is ATen's: ATen then picks oneDNN or its loops by size, so a probe
// of a few shapes can pass while larger products go to oneDNN (an AMD Zen 5, 2026-12-07: the
// running order's probe passed, batched products of 3 x 33 x 150 x 40 differed, and Muon's exact
// step left train.py's trajectory at step 5). DION_BF16_LOOP_GEMM=0 turns the kernel off
// (measurements); without AVX2 and FMA it is never used.
//
// Tests: tests/math/test_bf16_matmul.cpp (each order against a scalar transcription of it on every
// CPU; against at::matmul where the probes pass, which the bf16_loop.* environment, oneDNN capped
// at AVX2, makes true on AVX2-kernel CPUs).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace dion::math::cpu {

enum class Bf16SumOrder { four_way = 0, running = 1, dot64 = 2 };
std::string to_string(Bf16SumOrder order);

// The product in one of ATen's loop orders. a [m, k] and b [k, n], or a [B, m, k] and
// b [B, k, n]; bf16 CPU tensors of any strides; returns a contiguous bf16 [m, n] / [B, m, n].
// Throws std::invalid_argument (naming the shapes or dtypes) for anything else, and where the CPU
// has no AVX2 and FMA.
at::Tensor bf16_matmul_in_order(const at::Tensor& a, const at::Tensor& b, Bf16SumOrder order);

// Whether this process's at::matmul sums in `order` where its layout runs it (the probe above;
// false without AVX2 and FMA or under DION_BF16_LOOP_GEMM=0). Decided on the first call.
bool aten_bf16_order_confirmed(Bf16SumOrder order);

// The order at::matmul(a, b) sums in, where this library reproduces it: both bf16 CPU tensors,
// 2-D x 2-D or 3-D x 3-D with one batch size, m and n at least 2, at least 400 multiply-adds a
// matrix, the order of the operands' layouts (as addmm_impl_cpu_ reads their strides) confirmed.
std::optional<Bf16SumOrder> aten_bf16_sum_order(const at::Tensor& a, const at::Tensor& b);

// at::matmul(a, b), bit for bit: bf16_matmul_in_order where aten_bf16_sum_order(a, b) has an
// order, ATen's own call otherwise.
at::Tensor exact_matmul(const at::Tensor& a, const at::Tensor& b);

}  // namespace dion::math::cpu
