// The fast orthogonalizers: Newton-Schulz / Polar Express on reused workspaces with symmetric
// products, and Gram Newton-Schulz (see include/dion/math/ortho.h).
//
// What it is not: the exact path (ortho.cpp keeps the reference's operation order); nothing
// here is bit-identical to the reference, the differences are bf16 rounding (tests/test_ortho).
//
// Orientation: every iteration runs on the wide form X [B, r, c], r = min(m, n) <= c, so the
// Gram matrix is X X^T [B, r, r]. A tall input is copied transposed into the workspace once
// and the result copied back transposed once (two passes over m x n, against 5 x 3 products).
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

// Buffers of one (batch, r, c, dtype): two of the iterate and five Gram-sized ones. Reused by
// every later call with the same key on this thread (the optimizer calls from one thread).
struct Workspace {
  at::Tensor X[2];   // [B, r, c]
  at::Tensor S[5];   // [B, r, r]: A, B (Newton-Schulz); R, Z, RZ, Q, Q' (Gram)
};

using WorkspaceKey = std::tuple<int64_t, int64_t, int64_t, at::ScalarType>;

// At most this many shapes are kept per thread; past it the cache starts over (an optimizer
// has a handful of megabatch shapes, so in practice nothing is evicted).
constexpr size_t kMaxWorkspaces = 32;

Workspace& workspace_for(int64_t batch, int64_t r, int64_t c, at::ScalarType dtype) {
  thread_local std::map<WorkspaceKey, Workspace> cache;
  const WorkspaceKey key{batch, r, c, dtype};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxWorkspaces) cache.clear();
  const auto opts = at::TensorOptions().dtype(dtype);
  Workspace ws;
  for (at::Tensor& x : ws.X) x = at::empty({batch, r, c}, opts);
  for (at::Tensor& s : ws.S) s = at::empty({batch, r, r}, opts);
  return cache.emplace(key, std::move(ws)).first->second;
}

// ---------------------------------------------------------------------------- shared steps

struct Prepared {
  at::Tensor G3;      // the input viewed as [B, m, n]
  bool tall;          // m > n: the workspace holds G^T
  int64_t r, c;       // wide shape in the workspace
  Workspace* ws;
};

Prepared prepare(const at::Tensor& G, at::ScalarType dtype, const char* who) {
  TORCH_CHECK(G.dim() >= 2, who, ": expected a matrix or a batch of matrices [..., m, n], got shape ",
              G.sizes());
  Prepared p;
  p.G3 = G.dim() == 2 ? G.unsqueeze(0) : G.reshape({-1, G.size(-2), G.size(-1)});
  p.tall = G.size(-2) > G.size(-1);
  p.r = p.tall ? G.size(-1) : G.size(-2);
  p.c = p.tall ? G.size(-2) : G.size(-1);
  p.ws = &workspace_for(p.G3.size(0), p.r, p.c, dtype);
  return p;
}

// The result [..., m, n] from the wide iterate X [B, r, c] (a fresh tensor: never a workspace).
at::Tensor finish(const Prepared& p, const at::Tensor& G, const at::Tensor& X) {
  at::Tensor out = at::empty(p.G3.sizes(), X.options());
  out.copy_(p.tall ? X.mT() : X);
  return out.view(G.sizes());
}

// One polynomial step X' = a X + (b A + c A^2) X with A = X X^T, into `next`.
void newton_schulz_step(const at::Tensor& X, at::Tensor next, Workspace& ws,
                        const Coeffs& k, bool tiled) {
  at::Tensor& A = ws.S[0];
  at::Tensor& B = ws.S[1];
  gram_out(A, X, tiled);                                  // A = X X^T     [B, r, r]
  symmetric_product_out(B, A, A, A, k.b, k.c, tiled);    // B = b A + c A A
  at::baddbmm_out(next, X, B, X, k.a, 1.0);               // X' = a X + B X [B, r, c]
}

template <size_t N>
at::Tensor iterate(const at::Tensor& G, const std::array<Coeffs, N>& coeffs, double scale,
                   double epsilon, at::ScalarType dtype, bool tiled, const char* who) {
  Prepared p = prepare(G, dtype, who);
  Workspace& ws = *p.ws;
  at::Tensor X = ws.X[0];
  X.copy_(p.tall ? p.G3.mT() : p.G3);
  // X / (||X||_F * scale + epsilon), the norm of the compute-dtype copy as in the reference.
  at::Tensor norm = at::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true);
  X.div_(norm.mul_(scale).add_(epsilon));
  int cur = 0;
  for (size_t i = 0; i + 1 < coeffs.size(); ++i) {
    newton_schulz_step(ws.X[cur], ws.X[1 - cur], ws, coeffs[i], tiled);
    cur = 1 - cur;
  }
  if (p.tall) {
    newton_schulz_step(ws.X[cur], ws.X[1 - cur], ws, coeffs.back(), tiled);
    return finish(p, G, ws.X[1 - cur]);
  }
  // Wide: the last step writes the result tensor itself (no copy out of the workspace).
  at::Tensor out = at::empty(p.G3.sizes(), X.options());
  newton_schulz_step(ws.X[cur], out, ws, coeffs.back(), tiled);
  return out.view(G.sizes());
}

}  // namespace

// ---------------------------------------------------------------------------- public

at::Tensor orthogonalize_fast(const at::Tensor& G, OrthoMethod method, double epsilon,
                              at::ScalarType dtype) {
  if (method == OrthoMethod::NEWTON_SCHULZ)
    return iterate(G, detail::kNewtonSchulz, 1.0, epsilon, dtype, true, "newton_schulz");
  return iterate(G, detail::kPolarExpress, 1.02, epsilon, dtype, true, "polar_express");
}

at::Tensor gram_newton_schulz(const at::Tensor& G, double epsilon, at::ScalarType dtype,
                              bool tiled) {
  const auto& coeffs = detail::kGramPolarExpress;
  if (G.dim() >= 2 && G.size(-2) == G.size(-1)) {
    // The package's standard iteration for square inputs: its norm in fp32, no safety factor.
    // (Same polynomial steps as Newton-Schulz; only the normalization's precision differs.)
    return iterate(G, coeffs, 1.0, epsilon, dtype, tiled, "gram_newton_schulz");
  }
  Prepared p = prepare(G, dtype, "gram_newton_schulz");
  Workspace& ws = *p.ws;
  // X = (G / (||G||_F + epsilon)).to(dtype), the norm and the division in fp32 (the package's).
  const at::Tensor G3 = p.tall ? p.G3.mT() : p.G3;
  const at::Tensor norm =
      at::linalg_vector_norm(G3, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true, at::kFloat);
  int cur = 0;
  ws.X[cur].copy_(G3.to(at::kFloat).div(norm.add(epsilon)));

  at::Tensor &R = ws.S[0], &Z = ws.S[1], &RZ = ws.S[2];
  at::Tensor Q = ws.S[3], Qn = ws.S[4];
  gram_out(R, ws.X[cur], tiled);  // R = X X^T [B, r, r]
  const int last = static_cast<int>(coeffs.size()) - 1;
  for (int i = 0; i <= last; ++i) {
    const Coeffs& k = coeffs[static_cast<size_t>(i)];
    const bool restart = i == detail::kGramResetStep;
    if (restart) {  // X <- Q X, R = X X^T: drop the accumulated rounding of R
      at::bmm_out(ws.X[1 - cur], Q, ws.X[cur]);
      cur = 1 - cur;
      gram_out(R, ws.X[cur], tiled);
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
  at::bmm_out(ws.X[1 - cur], Q, ws.X[cur]);  // Q X [B, r, c]
  return finish(p, G, ws.X[1 - cur]);
}

}  // namespace dion::math
