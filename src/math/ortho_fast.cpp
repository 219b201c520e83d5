// The fast orthogonalizers: Newton-Schulz / Polar Express on reused workspaces with symmetric
// products, and Gram Newton-Schulz (see include/dion/math/ortho.h).
//
// What it is not: the exact path (ortho.cpp keeps the reference's operation order); nothing
// here is bit-identical to the reference, the differences are bf16 rounding (tests/test_ortho).
//
// Orientation: X keeps the input's layout [B, m, n]; the Gram matrix is on the small side,
// X X^T [B, m, m] for wide and X^T X [B, n, n] for tall inputs (a transposed operand is a flag
// to the GEMM, not a copy), and the polynomial multiplies from that side (B X, resp. X B).
// Nothing is transposed in memory, and the last step writes the result tensor itself.
#include "dion/math/ortho.h"

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "dion/math/symmetric.h"
#include "ortho_coeffs.h"

namespace dion::math {

namespace {

using detail::Coeffs;

// ---------------------------------------------------------------------------- workspaces

// Buffers of one (batch, m, n, dtype, device): two of the iterate [B, m, n] and five Gram-sized
// ones [B, r, r], r = min(m, n), on the input's device. Reused by every later call with the same
// key on this thread (the optimizer calls from one thread; on CUDA every call of a thread uses
// its current stream, so a buffer is never in use by two streams at once).
struct Workspace {
  at::Tensor X[2];  // [B, m, n]
  at::Tensor S[5];  // [B, r, r]: A, B (Newton-Schulz); R, Z, RZ, Q, Q' (Gram)
};

using WorkspaceKey = std::tuple<int64_t, int64_t, int64_t, at::ScalarType, at::DeviceType, at::DeviceIndex>;

// At most this many shapes are kept per thread; past it the cache starts over (an optimizer
// has a handful of megabatch shapes, so in practice nothing is evicted).
constexpr size_t kMaxWorkspaces = 32;

Workspace& workspace_for(int64_t batch, int64_t m, int64_t n, at::ScalarType dtype, const at::Device& device) {
  thread_local std::map<WorkspaceKey, Workspace> cache;
  const WorkspaceKey key{batch, m, n, dtype, device.type(), device.index()};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxWorkspaces) cache.clear();
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const int64_t r = std::min(m, n);
  Workspace ws;
  for (at::Tensor& x : ws.X) x = at::empty({batch, m, n}, opts);
  for (at::Tensor& s : ws.S) s = at::empty({batch, r, r}, opts);
  return cache.emplace(key, std::move(ws)).first->second;
}

// ---------------------------------------------------------------------------- shared steps

struct Prepared {
  at::Tensor G3;  // the input viewed as [B, m, n]
  bool tall;      // m > n: Gram matrix X^T X, polynomial applied from the right
  Workspace* ws;
};

Prepared prepare(const at::Tensor& G, at::ScalarType dtype, const char* who) {
  TORCH_CHECK(G.dim() >= 2, who, ": expected a matrix or a batch of matrices [..., m, n], got shape ", G.sizes());
  Prepared p;
  p.G3 = G.dim() == 2 ? G.unsqueeze(0) : G.reshape({-1, G.size(-2), G.size(-1)});
  p.tall = G.size(-2) > G.size(-1);
  p.ws = &workspace_for(p.G3.size(0), p.G3.size(1), p.G3.size(2), dtype, G.device());
  return p;
}

// P = X X^T (wide) or X^T X (tall) [B, r, r].
void small_gram(const at::Tensor& P, const at::Tensor& X, bool tall, bool tiled) {
  if (tall)
    symmetric_product_out(P, X.mT(), X, at::Tensor(), 0.0, 1.0, tiled);
  else
    gram_out(P, X, tiled);
}

// out = a X + B X (wide) or a X + X B (tall); B [B, r, r] symmetric.
void apply_add(const at::Tensor& out, const at::Tensor& X, const at::Tensor& B, double a, bool tall) {
  if (tall)
    batched_product_out(out, X, B, X, a, 1.0);
  else
    batched_product_out(out, B, X, X, a, 1.0);
}

// out = Q X (wide) or X Q (tall).
void apply(const at::Tensor& out, const at::Tensor& Q, const at::Tensor& X, bool tall) {
  if (tall)
    batched_product_out(out, X, Q, at::Tensor(), 0.0, 1.0);
  else
    batched_product_out(out, Q, X, at::Tensor(), 0.0, 1.0);
}

// One polynomial step X' = a X + (b A + c A^2) X with A the small Gram matrix, into `next`.
void newton_schulz_step(const at::Tensor& X, const at::Tensor& next, Workspace& ws, const Coeffs& k, bool tall,
                        bool tiled) {
  const at::Tensor& A = ws.S[0];
  const at::Tensor& B = ws.S[1];
  small_gram(A, X, tall, tiled);                       // A [B, r, r]
  symmetric_product_out(B, A, A, A, k.b, k.c, tiled);  // B = b A + c A A
  apply_add(next, X, B, k.a, tall);                    // X' = a X + B X   [B, m, n]
}

template <size_t N>
at::Tensor iterate(const at::Tensor& G, const std::array<Coeffs, N>& coeffs, double scale, double epsilon,
                   at::ScalarType dtype, bool tiled, const char* who) {
  Prepared p = prepare(G, dtype, who);
  Workspace& ws = *p.ws;
  at::Tensor X = ws.X[0];
  X.copy_(p.G3);
  // X / (||X||_F * scale + epsilon), the norm of the compute-dtype copy as in the reference.
  at::Tensor norm = at::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true);
  X.div_(norm.mul_(scale).add_(epsilon));
  int cur = 0;
  for (size_t i = 0; i + 1 < N; ++i) {
    newton_schulz_step(ws.X[cur], ws.X[1 - cur], ws, coeffs[i], p.tall, tiled);
    cur = 1 - cur;
  }
  // The last step writes the result tensor itself (never a workspace).
  at::Tensor out = at::empty(p.G3.sizes(), X.options());
  newton_schulz_step(ws.X[cur], out, ws, coeffs.back(), p.tall, tiled);
  return out.view(G.sizes());
}

}  // namespace

// ---------------------------------------------------------------------------- public

at::Tensor orthogonalize_fast(const at::Tensor& G, OrthoMethod method, double epsilon, at::ScalarType dtype,
                              bool tiled) {
  if (method == OrthoMethod::NEWTON_SCHULZ)
    return iterate(G, detail::kNewtonSchulz, 1.0, epsilon, dtype, tiled, "newton_schulz");
  return iterate(G, detail::kPolarExpress, 1.02, epsilon, dtype, tiled, "polar_express");
}

at::Tensor gram_newton_schulz(const at::Tensor& G, double epsilon, std::optional<at::ScalarType> compute, bool tiled) {
  const at::ScalarType dtype = compute ? *compute : G.is_cpu() ? cpu_compute_dtype(at::kHalf).dtype : at::kHalf;
  const auto& coeffs = detail::kGramPolarExpress;
  if (G.dim() >= 2 && G.size(-2) == G.size(-1)) {
    // The package's standard iteration for square inputs: its norm in fp32, no safety factor.
    // (Same polynomial steps as Newton-Schulz; only the normalization's precision differs.)
    return iterate(G, coeffs, 1.0, epsilon, dtype, tiled, "gram_newton_schulz");
  }
  Prepared p = prepare(G, dtype, "gram_newton_schulz");
  Workspace& ws = *p.ws;
  const bool tall = p.tall;
  // X = (G / (||G||_F + epsilon)).to(dtype), the norm and the division in fp32 (the package's).
  const at::Tensor norm = at::linalg_vector_norm(p.G3, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true, at::kFloat);
  int cur = 0;
  ws.X[cur].copy_(p.G3.to(at::kFloat).div(norm.add(epsilon)));

  const at::Tensor &R = ws.S[0], &Z = ws.S[1], &RZ = ws.S[2];
  at::Tensor Q = ws.S[3], Qn = ws.S[4];
  small_gram(R, ws.X[cur], tall, tiled);  // R [B, r, r]
  const int last = static_cast<int>(coeffs.size()) - 1;
  for (int i = 0; i <= last; ++i) {
    const Coeffs& k = coeffs[static_cast<size_t>(i)];
    const bool restart = i == detail::kGramResetStep;
    if (restart) {  // X <- Q X, R = its Gram matrix: drop the accumulated rounding of R
      apply(ws.X[1 - cur], Q, ws.X[cur], tall);
      cur = 1 - cur;
      small_gram(R, ws.X[cur], tall, tiled);
    }
    symmetric_product_out(Z, R, R, R, k.b, k.c, tiled);  // Z = b R + c R R
    if (i == 0 || restart) {
      Q.copy_(Z);
      Q.diagonal(0, -2, -1).add_(k.a);  // Q = Z + a I
    } else {
      symmetric_product_out(Qn, Q, Z, Q, k.a, 1.0, tiled);  // Q = a Q + Q Z
      std::swap(Q, Qn);
    }
    if (i < last && i + 1 != detail::kGramResetStep) {
      symmetric_product_out(RZ, R, Z, R, k.a, 1.0, tiled);   // RZ = a R + R Z
      symmetric_product_out(R, Z, RZ, RZ, k.a, 1.0, tiled);  // R = a RZ + Z RZ
    }
  }
  at::Tensor out = at::empty(p.G3.sizes(), ws.X[cur].options());
  apply(out, Q, ws.X[cur], tall);  // Q X (X Q when tall): the result
  return out.view(G.sizes());
}

}  // namespace dion::math
