// Newton-Schulz and Polar Express orthogonalization (see include/dion/math/ortho.h).
//
// Every operation mirrors the reference's eager PyTorch code in order and dtype, so that the
// same LibTorch kernels produce the same bits: the bf16 path matches microsoft/dion run on CPU
// exactly (tests/optim/test_reference.cpp). The products go through cpu::exact_matmul, which is
// at::matmul bit for bit (ATen's own reference loop vectorized where ATen runs that loop: CPUs
// without native bf16 GEMMs, dion/math/bf16_matmul_cpu.h).
#include "dion/math/ortho.h"

#include "dion/math/bf16_matmul_cpu.h"
#include "dion/math/elementwise.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "ortho_coeffs.h"

#include <atomic>
#include <optional>
#include <map>
#include <stdexcept>

namespace dion::math {

namespace {

using detail::Coeffs;
using detail::kNewtonSchulz;
using detail::kPolarExpress;
using cpu::exact_matmul;

void check_matrix(const at::Tensor& G, const char* who) {
  TORCH_CHECK(G.dim() >= 2, who, ": expected a matrix or a batch of matrices [..., m, n], got shape ", G.sizes());
}

at::Tensor frobenius(const at::Tensor& X) {
  return at::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true);
}

}  // namespace

OrthoMethod ortho_method_from_string(const std::string& name) {
  if (name == "polar_express") return OrthoMethod::POLAR_EXPRESS;
  if (name == "newton_schulz") return OrthoMethod::NEWTON_SCHULZ;
  throw std::invalid_argument("unknown orthogonalizer '" + name +
                              "': valid values are 'polar_express' and 'newton_schulz'");
}

std::string to_string(OrthoMethod method) {
  return method == OrthoMethod::POLAR_EXPRESS ? "polar_express" : "newton_schulz";
}

namespace {
// `X * a + P * c` (c given) or `X * a + P`, P a GEMM's fresh result: one fused pass into P where
// both are contiguous CPU tensors of one dtype (bit-identical: dion/math/elementwise.h), the
// ATen composition otherwise (a transposed X keeps its layout there, as the reference's does).
at::Tensor scaled_sum(const at::Tensor& X, double a, at::Tensor P, std::optional<double> c = std::nullopt) {
  if (X.is_contiguous() && X.scalar_type() == P.scalar_type() && cpu::cpu_fusable(X, P)) {
    cpu::scaled_add_(X, static_cast<float>(a), P, static_cast<float>(c.value_or(1.0)), c.has_value());
    return P;
  }
  return c ? X * a + P * *c : X * a + P;
}
}  // namespace

at::Tensor newton_schulz(const at::Tensor& G, double epsilon, at::ScalarType dtype) {
  check_matrix(G, "newton_schulz");
  const bool tall = G.size(-2) > G.size(-1);
  at::Tensor X = G.to(dtype);
  if (tall) X = X.mT();
  X = X / (frobenius(X) + epsilon);  // spectral norm <= Frobenius norm <= 1
  for (const Coeffs& k : kNewtonSchulz) {
    at::Tensor A = exact_matmul(X, X.mT());          // [.., m, m], m = min(rows, cols)
    at::Tensor B = scaled_sum(A, k.b, exact_matmul(A, A), k.c);  // b A + c A^2
    X = scaled_sum(X, k.a, exact_matmul(B, X));                  // a X + B X
  }
  if (tall) X = X.mT();
  return X;
}

at::Tensor polar_express(const at::Tensor& G, double epsilon, at::ScalarType dtype) {
  check_matrix(G, "polar_express");
  const bool tall = G.size(-2) > G.size(-1);
  at::Tensor X = G.to(dtype);
  X = X / (frobenius(X) * 1.02 + epsilon);
  if (tall) {
    for (const Coeffs& k : kPolarExpress) {  // Gram matrix on the small side: X^T X [.., n, n]
      at::Tensor A = exact_matmul(X.mT(), X);
      at::Tensor B = scaled_sum(A, k.b, exact_matmul(A, A), k.c);
      X = scaled_sum(X, k.a, exact_matmul(X, B));
    }
  } else {
    for (const Coeffs& k : kPolarExpress) {  // X X^T [.., m, m]
      at::Tensor A = exact_matmul(X, X.mT());
      at::Tensor B = scaled_sum(A, k.b, exact_matmul(A, A), k.c);
      X = scaled_sum(X, k.a, exact_matmul(B, X));
    }
  }
  return X;
}

OrthoPath ortho_path_from_string(const std::string& name) {
  if (name == "exact") return OrthoPath::EXACT;
  if (name == "fast") return OrthoPath::FAST;
  throw std::invalid_argument("unknown orthogonalizer path '" + name + "': valid values are 'exact' and 'fast'");
}

std::string to_string(OrthoPath path) { return path == OrthoPath::EXACT ? "exact" : "fast"; }

CpuComputeDtype OrthoConfig::cpu_compute() const {
  if (custom) return {dtype, "a user-supplied orthogonalizer"};
  if (!use_gram_newton_schulz && path == OrthoPath::EXACT)
    return {dtype, dtype_short_name(dtype) + ": the exact path computes in OrthoConfig::dtype"};
  if (cpu_dtype) return {*cpu_dtype, dtype_short_name(*cpu_dtype) + ": OrthoConfig::cpu_dtype"};
  return cpu_compute_dtype(use_gram_newton_schulz ? at::kHalf : dtype);
}

namespace {

// Said once per process and dtype, the first time the exact path multiplies in a type this CPU
// has no native GEMM for and that the library cannot run at speed: ATen then runs a scalar
// fallback, 30-100x slower than fp32 (measured: 0.7 GFLOP/s bf16 against 80 fp32 on an AVX2-only
// AMD EPYC), minutes a step on a GPT-2-size model; the fast path picks fp32 there
// (cpu_compute_dtype). Not said for bf16 where exact_matmul reproduces ATen's loops
// (dion/math/bf16_matmul_cpu.h): that runs near the fp32 rate.
void note_slow_exact_dtype(at::ScalarType dt) {
  if (dt != at::kBFloat16 && dt != at::kHalf) return;
  static std::atomic<bool> said_bf16{false}, said_fp16{false};
  std::atomic<bool>& said = dt == at::kBFloat16 ? said_bf16 : said_fp16;
  if (said.load(std::memory_order_relaxed)) return;
  std::string why;
  if (cpu_has_native_gemm(dt, &why)) return;
  if (dt == at::kBFloat16 && cpu::aten_bf16_order_confirmed(cpu::Bf16SumOrder::four_way)) return;
  if (said.exchange(true)) return;
  TORCH_WARN("dion: the exact orthogonalization computes in ", dtype_short_name(dt),
             " (the reference's dtype) on the CPU, but ", why,
             ": ATen runs these GEMMs on a scalar fallback, 30-100x slower than fp32 here. For speed use the fast "
             "path, which computes in fp32 on such a CPU (C++: OrthoConfig::path = OrthoPath::FAST; Python: "
             "dion_cpp._C.set_ortho_path(\"fast\") before building the optimizer; dion-train: ortho_path fast, its "
             "default); the exact path stays bit for bit the reference's.");
}

}  // namespace

OrthoFn OrthoConfig::function() const {
  if (custom) return custom;
  const at::ScalarType dt = dtype;
  const bool tiled = path == OrthoPath::FAST;
  if (use_gram_newton_schulz) {
    // The reference passes no epsilon (the package's 1e-7) and computes in fp16 whatever the
    // optimizer's dtype; on a CPU without native fp16 GEMMs in fp32 (cpu_compute), the result
    // cast to fp16 as the reference returns it.
    const at::ScalarType cpu = cpu_compute().dtype;
    return [tiled, cpu](const at::Tensor& X, double) {
      if (!X.is_cpu()) return gram_newton_schulz(X, 1e-7, at::kHalf, tiled);
      at::Tensor U = gram_newton_schulz(X, 1e-7, cpu, tiled);
      return cpu == at::kHalf ? U : U.to(at::kHalf);
    };
  }
  if (path == OrthoPath::FAST) {
    const OrthoMethod m = method;
    const at::ScalarType cpu = cpu_compute().dtype;
    return [dt, cpu, m](const at::Tensor& X, double eps) {
      if (!X.is_cpu() || cpu == dt) return orthogonalize_fast(X, m, eps, dt);
      return orthogonalize_fast(X, m, eps, cpu).to(dt);  // the optimizer's dtype, as before
    };
  }
  if (method == OrthoMethod::NEWTON_SCHULZ)
    return [dt](const at::Tensor& X, double eps) {
      if (X.is_cpu()) note_slow_exact_dtype(dt);
      return newton_schulz(X, eps, dt);
    };
  return [dt](const at::Tensor& X, double eps) {
    if (X.is_cpu()) note_slow_exact_dtype(dt);
    return polar_express(X, eps, dt);
  };
}

at::Tensor stack_megabatch(const std::vector<at::Tensor>& U) {
  TORCH_CHECK(!U.empty(), "stack_megabatch: empty megabatch");
  const at::Tensor& first = U[0];
  if (U.size() == 1) return first.unsqueeze(0);
  const int64_t bytes = first.numel() * static_cast<int64_t>(first.element_size());
  bool adjacent = first.is_contiguous() && bytes > 0;
  for (size_t i = 1; adjacent && i < U.size(); ++i) {
    const at::Tensor& u = U[i];
    adjacent = u.is_contiguous() && u.sizes() == first.sizes() && u.scalar_type() == first.scalar_type() &&
               u.device() == first.device() && u.is_alias_of(first) &&
               static_cast<const char*>(u.data_ptr()) ==
                   static_cast<const char*>(first.data_ptr()) + static_cast<int64_t>(i) * bytes;
  }
  if (!adjacent) return at::stack(U, 0);
  std::vector<int64_t> sizes = {static_cast<int64_t>(U.size())}, strides = {first.numel()};
  for (int64_t d = 0; d < first.dim(); ++d) {
    sizes.push_back(first.size(d));
    strides.push_back(first.stride(d));
  }
  return first.as_strided(sizes, strides, first.storage_offset());  // [N, *shape], no copy
}

at::Tensor orthogonalize_megabatch(const at::Tensor& X, const OrthoFn& fn, bool flatten, double epsilon,
                                   const std::vector<int64_t>& split_sizes, const std::vector<double>& split_scales) {
  RECORD_USER_SCOPE("dion::orthogonalize");
  // X: [N, *param_shape]
  TORCH_CHECK(X.dim() >= 3, "orthogonalize_megabatch: expected [N, m, n] or more, got ", X.sizes());
  if (!split_sizes.empty()) {
    // Row blocks of dim -2, as if each block were its own parameter. Blocks of equal height
    // share one batched call (the K and V blocks of a fused GQA QKV weight).
    TORCH_CHECK(!flatten, "split_sizes is incompatible with flatten=true");
    int64_t total = 0;
    for (int64_t s : split_sizes) total += s;
    TORCH_CHECK(total == X.size(-2), "split_sizes sum to ", total, " but dim -2 is ", X.size(-2));
    std::vector<at::Tensor> blocks = X.split_with_sizes(split_sizes, -2);
    std::map<int64_t, std::vector<size_t>> by_rows;
    for (size_t i = 0; i < blocks.size(); ++i) by_rows[blocks[i].size(-2)].push_back(i);
    std::vector<at::Tensor> out(blocks.size());
    for (const auto& [rows, idx] : by_rows) {
      std::vector<at::Tensor> same;
      for (size_t i : idx) same.push_back(blocks[i]);
      at::Tensor stacked = at::stack(same, 0);
      at::Tensor batched = stacked.dim() > 3 ? stacked.flatten(0, -3) : stacked;
      at::Tensor ortho = fn(batched, epsilon).reshape(stacked.sizes());
      for (size_t j = 0; j < idx.size(); ++j) {
        at::Tensor block = ortho[static_cast<int64_t>(j)];
        if (!split_scales.empty()) block = block * split_scales[idx[j]];
        out[idx[j]] = block;
      }
    }
    return at::cat(out, -2);
  }
  const auto shape = X.sizes();
  at::Tensor Y = X;
  if (flatten && X.dim() >= 4) {
    Y = X.flatten(2);  // [N, out, prod(rest)]: each parameter its own matrix
  } else if (X.dim() >= 4) {
    Y = X.flatten(0, -3);  // leading dims are a batch of matrices
  }
  return fn(Y, epsilon).reshape(shape);
}

}  // namespace dion::math
