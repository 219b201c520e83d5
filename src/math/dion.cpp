// Legacy Dion, single process (see include/dion/math/dion.h). Mirrors the reference's
// dion_update_ddp with no replicate mesh.
#include "dion/math/dion.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include "dion/math/rates.h"
#include "dion/math/elementwise.h"
#include "scalar_tensor.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dion::math {

int64_t dion_rank(int64_t m, int64_t n, double rank_fraction, int64_t rank_multiple_of) {
  const double r = rank_fraction * static_cast<double>(std::min(m, n));
  const int64_t rounded = rank_multiple_of * static_cast<int64_t>(std::ceil(r / static_cast<double>(rank_multiple_of)));
  return std::min({rounded, m, n});
}

bool dion_is_transposed_sharded(int64_t m, int64_t n, int64_t outer_dim, int64_t inner_dim) {
  if (inner_dim == 0 || outer_dim == 1) return false;  // orthogonalize over the inner (TP) dim
  if (outer_dim == 0 || inner_dim == 1) return true;
  return dion_is_transposed(m, n);
}

at::Generator dion_sketch_generator(const at::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  // CUDA (and other accelerators): a fresh generator of the device's kind, from its hooks.
  at::Generator gen = at::globalContext()
                          .getAcceleratorHooksInterface(device.type())
                          .getNewGenerator(device.has_index() ? device.index() : 0);
  gen.set_current_seed(seed);
  return gen;
}

at::Tensor dion_orthonormalize(const at::Tensor& P, float oversample, std::optional<at::Generator> generator) {
  RECORD_USER_SCOPE("dion::dion_orthonormalize");
  TORCH_CHECK(P.dim() >= 3, "dion_orthonormalize expects a batch [B, rows, r], got ", P.sizes());
  const auto dtype = P.scalar_type();
  const int64_t rows = P.size(-2), r = P.size(-1);
  if (rows <= r) {  // square or wide: plain QR is cheapest
    return std::get<0>(at::linalg_qr(P.to(at::kFloat))).to(dtype).contiguous();
  }
  // Randomized Cholesky QR: R from a QR of the sketch S P, then one Cholesky QR pass.
  const float kf = std::ceil(oversample * static_cast<float>(r) / 128.0f);
  const int64_t k = static_cast<int64_t>(kf) * 128;
  std::vector<int64_t> s_shape(P.sizes().begin(), P.sizes().end() - 2);
  s_shape.push_back(k);
  s_shape.push_back(rows);
  at::Tensor S = at::empty(s_shape, P.options()).normal_(0.0, std::sqrt(1.0 / static_cast<double>(k)), generator);
  at::Tensor SP = at::matmul(S, P);
  at::Tensor R = std::get<1>(at::linalg_qr(SP.to(at::kFloat), "r"));
  // linalg_solve_triangular(A, B, upper, left=false) solves X A = B, i.e. X = B A^-1.
  at::Tensor Pf = at::linalg_solve_triangular(R, P.to(at::kFloat), /*upper=*/true, /*left=*/false);
  at::Tensor PP = at::matmul(Pf.mT(), Pf);
  at::Tensor Rc = std::get<0>(at::linalg_cholesky_ex(PP, /*upper=*/true));
  Pf = at::linalg_solve_triangular(Rc, Pf, /*upper=*/true, /*left=*/false);
  return Pf.to(dtype).contiguous();
}

namespace {
// X[i] = beta * X[i] + alpha * (A B^T)[i]   (or (B A^T)[i] when transposed)
void foreach_baddbmm(at::TensorList X, const at::Tensor& A, const at::Tensor& B, const at::Tensor& alpha,
                     const at::Tensor& beta, bool transpose) {
  at::Tensor update = transpose ? at::matmul(B, A.mT()) : at::matmul(A, B.mT());
  std::vector<at::Tensor> parts = update.unbind(0);
  for (size_t i = 0; i < X.size(); ++i) {
    if (alpha.is_cpu() && beta.is_cpu() && cpu::cpu_fusable(X[i], parts[i]) && X[i].sizes() == parts[i].sizes()) {
      // One pass, bit-identical to the three ops below (dion/math/elementwise.h).
      cpu::decay_and_update_(X[i], parts[i], beta.item<float>(), alpha.item<float>(), /*step_in_x_dtype=*/false);
      continue;
    }
    at::Tensor scaled = scale(parts[i], alpha);
    scale_(X[i], beta);
    X[i].add_(scaled);
  }
}

// [B, 1, 1] bool: which matrices of M_batch [B, m, n] are all zero. On the CPU a scan that
// stops at the first nonzero entry (NaN counts as nonzero, -0 as zero, as `== 0` does).
at::Tensor all_zero_mask(const at::Tensor& M_batch) {
  if (!M_batch.device().is_cpu() || !M_batch.is_contiguous() ||
      (M_batch.scalar_type() != at::kFloat && M_batch.scalar_type() != at::kBFloat16))
    return (M_batch == 0).flatten(-2).all(-1).unsqueeze(-1).unsqueeze(-1);
  const int64_t B = M_batch.size(0), per = B > 0 ? M_batch.numel() / B : 0;
  at::Tensor mask = at::empty({B, 1, 1}, M_batch.options().dtype(at::kBool));
  bool* out = mask.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b) {
    bool zero = true;
    if (M_batch.scalar_type() == at::kFloat) {
      const float* p = M_batch.data_ptr<float>() + b * per;
      for (int64_t i = 0; zero && i < per; ++i) zero = p[i] == 0.0f;
    } else {
      const at::BFloat16* p = M_batch.data_ptr<at::BFloat16>() + b * per;
      for (int64_t i = 0; zero && i < per; ++i) zero = static_cast<float>(p[i]) == 0.0f;
    }
    out[b] = zero;
  }
  return mask;
}
}  // namespace

DionBatch dion_power(at::TensorList G, at::TensorList M, at::TensorList Q, int transposed) {
  RECORD_USER_SCOPE("dion::dion_power");
  DionBatch b;
  b.transposed = transposed < 0 ? dion_is_transposed(M[0].size(0), M[0].size(1)) : transposed == 1;
  bool fused = !M.empty();
  for (size_t i = 0; fused && i < M.size(); ++i)
    fused = M[i].dim() == 2 && M[i].sizes() == M[0].sizes() && cpu::cpu_fusable(M[i], G[i]);
  if (fused) {  // M += G and the stacking in one pass (bit-identical to the ops below)
    const int64_t m = M[0].size(0), n = M[0].size(1);
    b.M_batch = at::empty({static_cast<int64_t>(M.size()), b.transposed ? n : m, b.transposed ? m : n}, M[0].options());
    for (size_t i = 0; i < M.size(); ++i)
      cpu::add_and_copy_(M[i], G[i], b.M_batch[static_cast<int64_t>(i)], b.transposed);
  } else {
    for (size_t i = 0; i < M.size(); ++i) M[i].add_(G[i]);  // M += G
    std::vector<at::Tensor> Ms;
    for (const at::Tensor& mm : M) Ms.push_back(b.transposed ? mm.mT() : mm);
    b.M_batch = at::stack(Ms, 0);  // [B, m', n']
  }
  b.Q_batch = at::stack(Q, 0).to(b.M_batch.scalar_type());  // [B, n', r]
  b.P = at::matmul(b.M_batch, b.Q_batch);                   // [B, m', r]
  return b;
}

at::Tensor dion_R(const DionBatch& b, const at::Tensor& P) { return at::matmul(b.M_batch.mT(), P); }

void dion_step(at::TensorList X, at::TensorList G, at::TensorList M, at::TensorList Q, const Rates& r, float mu,
               float epsilon, float oversample) {
  DionBatch b = dion_power(G, M, Q);
  at::Tensor P = dion_orthonormalize(b.P, oversample);
  at::Tensor R = dion_R(b, P);  // [B, n', r]
  dion_finish(X, M, Q, b, P, R, r, mu, epsilon);
}

void dion_finish(at::TensorList X, at::TensorList M, at::TensorList Q, const DionBatch& b, at::Tensor P, at::Tensor R,
                 const Rates& r, float mu, float epsilon, c10::IntArrayRef shape,
                 const std::function<void(at::Tensor&)>& sum_columns) {
  RECORD_USER_SCOPE("dion::dion_finish");
  const int64_t m = shape.empty() ? X[0].size(0) : shape[0], n = shape.empty() ? X[0].size(1) : shape[1];
  const bool transposed = b.transposed;
  const at::Tensor& M_batch = b.M_batch;
  const at::Tensor& Q_batch = b.Q_batch;

  // All-zero momentum: P = 0 and R = previous Q (so Q is kept); NaNs are zeroed.
  at::Tensor all_zero = all_zero_mask(M_batch);  // [B, 1, 1]
  at::Tensor not_zero = all_zero.logical_not();
  P = P.nan_to_num() * not_zero;
  R = R.nan_to_num() * not_zero + Q_batch * all_zero;

  foreach_baddbmm(M, P, R, f32(-(1.0f - mu)), f32(1.0f), transposed);  // error feedback

  // Column-normalize R in fp32 to get the new Q.
  at::Tensor Rf = R.to(at::kFloat);
  at::Tensor col_sq = Rf.square().sum(-2, /*keepdim=*/true);
  if (sum_columns) {  // R's rows are sharded: add the other shards' column sums
    col_sq = col_sq.contiguous();
    sum_columns(col_sq);
  }
  at::Tensor col_norm = col_sq.sqrt();
  at::Tensor Q_new = (Rf / (col_norm + f32(epsilon))).to(R.scalar_type());

  // lr * sqrt(m / n): one float32 multiply, host or device (dion/math/rates.h)
  const Rates scaled = r.adjusted(static_cast<float>(std::sqrt(static_cast<double>(m) / static_cast<double>(n))));
  foreach_baddbmm(X, P, Q_new, scaled.neg_adjusted_lr_t(), scaled.decay_t(), transposed);

  std::vector<at::Tensor> Qs = Q_new.unbind(0);
  for (size_t i = 0; i < Q.size(); ++i) Q[i].copy_(Qs[i].to(Q[i].scalar_type()));
}

}  // namespace dion::math
