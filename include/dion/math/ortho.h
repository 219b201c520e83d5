// dion/math/ortho.h — orthogonalization of (batches of) matrices.
//
// What it is: the two polynomial iterations the reference optimizers use to approximate the
// polar factor U V^T of M = U S V^T, batched over every leading dimension:
//   - newton_schulz: the quintic Newton-Schulz iteration with the reference's five triples;
//   - polar_express: Polar Express (Amsel et al. 2025), the reference's default, with its five
//     per-step coefficient triples and the 1.02 safety factor.
// Both normalize by the Frobenius norm first (so the spectral norm is <= 1), work on the
// smaller Gram matrix (X X^T for wide, X^T X for tall inputs), and return the compute dtype.
// An all-zero matrix maps to all zeros (epsilon keeps the division finite).
//
// Two paths compute them (OrthoConfig::path):
//   - EXACT: newton_schulz / polar_express below, every operation in the reference's order and
//     dtype, so that the same LibTorch kernels give the reference's bits (the exact.* tests);
//   - FAST (opt-in; measured 1.6-2x faster in bf16 on one core, docs/benchmarks.md): orthogonalize_fast, the
//     same polynomial with (1) symmetric products X X^T and A A by lower block rows plus a
//     mirror (dion/math/symmetric.h), (2) b A + c A A and a X + B X fused into one
//     baddbmm each, on at::bmm rather than at::matmul (which takes a slower strided path for
//     a transposed operand at batch 1), (3) workspaces reused across calls (a per-thread cache
//     keyed by batch, shape and dtype), so a call allocates its result and little else.
//     Its results differ from the exact path's by bf16 rounding (measured in tests/test_ortho).
// A third orthogonalizer, gram_newton_schulz (the reference's use_gram_newton_schulz=True, the
// gram-newton-schulz package's algorithm), iterates on the m x m Gram matrix of a non-square
// input and applies the accumulated polynomial to X at the end, with a restart at step 2.
// On a CPU, OrthoConfig's FAST path and Gram NS (and gram_newton_schulz without a dtype)
// compute in a dtype the CPU multiplies natively (cpu_compute_dtype below: fp16 / bf16 where
// the CPU has the instructions, else fp32).
//
// What it is not: no momentum, no learning rate, no communication. The optimizers call these
// through an OrthoFn so that a user-supplied orthogonalizer can replace them.
//
// Shapes: G [..., m, n] -> U [..., m, n]. Leading dims are a batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dion::math {

// A user-supplied orthogonalizer: X [..., m, n] (compute dtype) -> U [..., m, n].
// epsilon is the group's epsilon. It must be batched over leading dims.
using OrthoFn = std::function<at::Tensor(const at::Tensor& X, double epsilon)>;

enum class OrthoMethod { POLAR_EXPRESS, NEWTON_SCHULZ };

// "polar_express" | "newton_schulz"; throws std::invalid_argument naming the valid values.
OrthoMethod ortho_method_from_string(const std::string& name);
std::string to_string(OrthoMethod method);

// Quintic Newton-Schulz, 5 steps with the reference's per-step coefficients.
// Computes in `dtype` (the reference uses bf16).
at::Tensor newton_schulz(const at::Tensor& G, double epsilon = 1e-7, at::ScalarType dtype = at::kBFloat16);

// Polar Express, 5 steps, safety factor 1.02 folded into the normalization.
at::Tensor polar_express(const at::Tensor& G, double epsilon = 1e-6, at::ScalarType dtype = at::kBFloat16);

// EXACT: the reference's operation order (bit-identical on the same kernels); FAST: see above.
enum class OrthoPath { EXACT, FAST };

// "exact" | "fast"; throws std::invalid_argument naming the valid values.
OrthoPath ortho_path_from_string(const std::string& name);
std::string to_string(OrthoPath path);

// The fast path of newton_schulz / polar_express (same coefficients, normalization and
// orientation; see the comment at the top). G [..., m, n] -> U [..., m, n] in `dtype`, on G's
// device (CPU or CUDA: the symmetric products of dion/math/symmetric.h have a path for each).
// tiled = false: full batched products instead of symmetric ones (for measuring what they save).
at::Tensor orthogonalize_fast(const at::Tensor& G, OrthoMethod method, double epsilon,
                              at::ScalarType dtype = at::kBFloat16, bool tiled = true);

// Gram Newton-Schulz (the reference's use_gram_newton_schulz=True; gram-newton-schulz 0.1.6):
// X = G / (||G||_F + epsilon) (the norm in fp32), then for a non-square matrix, with
// R = X X^T (m <= n; X^T X when tall) and the package's Polar Express coefficients:
//   Z = b R + c R^2;  Q = Z + a I at steps 0 and 2, else Q = a Q + Q Z;
//   R <- a RZ + Z RZ with RZ = a R + R Z (R tracks the Gram matrix of Q X);
//   at step 2 (the restart) X <- Q X and R = X X^T are recomputed; the result is Q X.
// A square matrix takes the standard 5-step iteration with the same coefficients (as the
// package does). Every product between two m x m polynomials in R is symmetric, so `tiled`
// computes them as symmetric products; tiled = false uses full batched products in the
// package's operation order (its torch backend). epsilon: the package's 1e-7.
// dtype: the compute dtype, and the result's. Unset: the package's fp16 on a GPU, and on the
// CPU cpu_compute_dtype(fp16) (below): fp16 where the CPU multiplies fp16 natively, else fp32.
// Never bf16 by default: the iterated Gram polynomial loses too much in it (singular values up
// to 1.66 at condition number 100, 1.84 in an earlier run, where fp16 stays under 1.15 and
// fp32 at 1.1236; tests/math/test_ortho_fast.cpp).
at::Tensor gram_newton_schulz(const at::Tensor& G, double epsilon = 1e-7,
                              std::optional<at::ScalarType> dtype = std::nullopt, bool tiled = true);

// ---------------------------------------------------------------------------- CPU compute dtype
//
// On a CPU, fp16 and bf16 GEMMs are fast only where the CPU multiplies that type natively and
// oneDNN may use those instructions; elsewhere ATen runs them on a scalar fallback (the exact
// path's bf16 products then go through cpu::exact_matmul, ATen's loops vectorized bit for bit:
// dion/math/bf16_matmul_cpu.h; the FAST path computes in fp32 there, and told to use fp16 /
// bf16 anyway it multiplies in fp32 and rounds each product once: dion/math/symmetric.h).
// One 512 x 512 product, one thread (best of 3-15, docs/benchmarks.md "CPU compute dtype"):
//   Intel Xeon (KVM; AVX512-FP16, AVX512-BF16, no AMX):       fp16 2.1-2.6 ms, bf16 3.6-7.3, fp32 1.9-2.8
//   the same, ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 (a Zen 4's ISA):  fp16 131-166, bf16 3.2-3.5, fp32 1.7-1.9
//   the same, ONEDNN_MAX_CPU_ISA=AVX2:                         fp16 150-159, bf16 156-179, fp32 1.9-2.0
//   AMD EPYC Zen 4 (AVX-512 BF16, no AVX512-FP16, no AMX):     fp16 102, bf16 1.4, fp32 3.2
// and Gram NS on 512 x 512 in fp16: 30-38 ms natively, 1,550-1,870 ms under the AVX512_CORE_BF16
// cap (1,026 ms on the Zen 4, where the exact path took 26 ms); in fp32 there 29-36 ms.
// So the FAST path and Gram NS pick their CPU compute dtype by what the CPU has:
//   - the dtype they would use (Gram NS: fp16, the package's; FAST: OrthoConfig::dtype) when
//     cpu_has_native_gemm says its GEMMs are native. For Gram NS that keeps the package's bits
//     (tests/vectors/gram: max |diff| 0) at fp32's speed or better; native bf16 is kept as the
//     reference's dtype although on this AMX-less Xeon it is no faster than fp32;
//   - else fp32: never a less precise type (bf16 instead of fp16 would break Gram NS's band),
//     and there the fastest accurate one.
// OrthoConfig::cpu_dtype, when set, wins; then DION_FAST_CPU_DTYPE=fp16|bf16|fp32 (for tests
// and benchmarks; 'auto' or unset: the rule). The EXACT path always computes in
// OrthoConfig::dtype (the reference's bits), and on a GPU nothing changes; where that dtype's
// GEMMs are not native it warns once per process (TORCH_WARN: stderr, or a Python warning),
// naming the fast path as the switch.

// Whether `dtype`'s GEMMs are native on this CPU: fp32 and fp64 always; fp16 with AVX512-FP16
// or AMX-FP16, bf16 with AVX512-BF16 or AMX-BF16 (cpuinfo's flags), each only when oneDNN is
// enabled and ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), when set, allows that ISA (e.g.
// AVX512_CORE_BF16 rules out fp16, AVX2 both). `why`, when given, receives one sentence.
bool cpu_has_native_gemm(at::ScalarType dtype, std::string* why = nullptr);

// Whether ATen hands bf16 CPU matmuls to oneDNN (those above 16^3 multiply-adds; torch 2.11's
// mkldnn_bf16_device_check): oneDNN enabled, and its ISA, as capped when first read in this
// process, reaching AVX512_CORE (avx512 F, BW, VL, DQ; also where bf16 is not native: oneDNN
// then converts) or AVX2_VNNI_2 (avx_ne_convert). Where it does not, every bf16 matmul runs
// ATen's own loops, which dion/math/bf16_matmul_cpu.h reproduces; where it does, ATen picks
// oneDNN or its loops by size, so the exact path leaves every bf16 product to ATen.
bool aten_bf16_matmul_uses_onednn();

struct CpuComputeDtype {
  at::ScalarType dtype;
  std::string reason;  // "fp32: fp16 GEMMs are not native: this CPU has avx512_fp16, but ..."
};

// The CPU compute dtype for a caller that wants `wanted` (the rule above, with the
// DION_FAST_CPU_DTYPE override; throws std::invalid_argument on a bad value of it).
CpuComputeDtype cpu_compute_dtype(at::ScalarType wanted);

// "fp16" | "bf16" | "fp32"; throws std::invalid_argument naming the valid values.
at::ScalarType cpu_dtype_from_string(const std::string& name);
// "fp16", "bf16", "fp32", "fp64" (else ATen's name).
std::string dtype_short_name(at::ScalarType dtype);

// Which orthogonalizer an optimizer uses. `custom`, when set, wins over everything else;
// use_gram_newton_schulz wins over `method` (as in the reference, where it implies Polar Express).
struct OrthoConfig {
  OrthoMethod method = OrthoMethod::POLAR_EXPRESS;
  at::ScalarType dtype = at::kBFloat16;  // compute (and communication) dtype
  OrthoFn custom;                        // optional user-supplied orthogonalizer
  bool use_gram_newton_schulz = false;   // the reference's flag of the same name
  // EXACT is the library's default: the library and the Python module are a drop-in for
  // microsoft/dion, whose numbers a user compares with (every reference-vector test and the
  // distributed bit-identity checks rely on them); dion-train defaults to FAST (its
  // ortho_path key; docs/convergence.md: the curves agree within the seed spread).
  OrthoPath path = OrthoPath::EXACT;
  // The FAST path's and Gram NS's compute dtype on a CPU; unset: cpu_compute_dtype of
  // `dtype` (FAST) or of fp16 (Gram NS). Either returns what it did before (`dtype`; fp16).
  std::optional<at::ScalarType> cpu_dtype = std::nullopt;
  // true: the project's own CUDA kernels (fused element-wise steps, the symmetric products'
  // block rows and mirror kernel) in this optimizer's step(), the orthogonalization included;
  // false: the process-wide setting, off by default (ATen's CUDA ops; dion/math/own_kernels.h).
  bool cuda_kernels = false;

  OrthoFn function() const;  // the callable the optimizers use
  // What function() computes in on a CPU, and why (for logs): the EXACT path's `dtype`, or the
  // FAST / Gram choice above. Reads DION_FAST_CPU_DTYPE as function() does.
  CpuComputeDtype cpu_compute() const;
};

// The megabatch U_0 .. U_{N-1} (same shape, dtype and device) as one tensor [N, *shape]: a view
// when they are already consecutive contiguous slices of one buffer (the optimizers' pre steps
// write them so), else at::stack's copy. One tensor: U_0.unsqueeze(0).
at::Tensor stack_megabatch(const std::vector<at::Tensor>& U);

// Orthogonalize a stacked megabatch X [N, *param_shape] the way the reference's orthogonalized
// update does, but with flatten applied per matrix:
//   flatten && param ndim >= 3: each [out, ...] becomes [out, prod(...)];
//   !flatten && param ndim >= 3: leading dims are a batch;
//   split_sizes: row blocks of dim -2 orthogonalized independently, each rescaled by
//   split_scales[i] (per-block learning-rate correction) when given.
at::Tensor orthogonalize_megabatch(const at::Tensor& X, const OrthoFn& fn, bool flatten, double epsilon,
                                   const std::vector<int64_t>& split_sizes = {},
                                   const std::vector<double>& split_scales = {});

}  // namespace dion::math
