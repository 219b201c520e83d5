// Dion2 (Ahn et al.): selected-submatrix orthogonalization with error feedback.
// See include/dion/math/dion2.h.
#include "dion/math/dion2.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "dion/cuda/fused.h"
#include "dion/math/rates.h"
#include "dion/math/elementwise.h"
#include "dion/math/own_kernels.h"
#include "scalar_tensor.h"

#include <algorithm>
#include <cmath>

namespace dion::math {

int64_t dion2_num_selected(double fraction, int64_t n_select) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n_select))));
}

int64_t dion2_select_dim(int64_t rows, int64_t cols) { return rows <= cols ? -2 : -1; }

namespace {
// Expand indices [.., k] to the shape of the selected slices of a [.., m, n] matrix.
at::Tensor expand_index(const at::Tensor& idx, const at::Tensor& like, int64_t select_dim) {
  if (select_dim == -2) {
    std::vector<int64_t> shape(idx.sizes().begin(), idx.sizes().end());
    shape.push_back(like.size(-1));
    return idx.unsqueeze(-1).expand(shape);
  }
  std::vector<int64_t> shape(idx.sizes().begin(), idx.sizes().end() - 1);
  shape.push_back(like.size(-2));
  shape.push_back(idx.size(-1));
  return idx.unsqueeze(-2).expand(shape);
}
}  // namespace

Selection dion2_pre(at::TensorList G, at::TensorList M, double fraction, float ef_decay, int64_t select_dim,
                    at::ScalarType comm_dtype, int64_t k_override, const std::function<void(at::Tensor&)>& sum_norms) {
  TORCH_CHECK(select_dim == -2 || select_dim == -1, "dion2: select_dim must be -2 or -1");
  RECORD_USER_SCOPE("dion::dion2_pre");
  Selection out;
  const int64_t n_select = M[0].size(select_dim);
  const int64_t norm_dim = select_dim == -2 ? -1 : -2;
  const int64_t k = k_override > 0 ? k_override : dion2_num_selected(fraction, n_select);
  const int64_t k_topk = std::min(k, n_select);

  // Contiguous float32 / bf16 CPU tensors of one shape take the fused kernels: M += G with the
  // slice norms in one pass, then the selection and its error feedback in one pass per matrix
  // (bit-identical to the ATen ops of the other branch). A 3-D+ tensor (an MoE's expert stack
  // [E, m, n]) is its B matrices [m, n] one after another, each selected apart as the ATen ops do.
  bool fused = n_select > 0 && (comm_dtype == at::kFloat || comm_dtype == at::kBFloat16);
  for (size_t i = 0; fused && i < M.size(); ++i)
    fused = M[i].dim() >= 2 && M[i].numel() > 0 && M[i].sizes() == M[0].sizes() && cpu::cpu_fusable(M[i], G[i]);
  const int64_t N = static_cast<int64_t>(M.size());
  // The fused branch's matrices: B of [m, n] in each M[i].
  const int64_t m = fused ? M[0].size(-2) : 0, n = fused ? M[0].size(-1) : 0, B = fused ? M[0].numel() / (m * n) : 0;
  at::Tensor norms, M_stacked;
  if (fused) {
    std::vector<int64_t> shape = M[0].sizes().vec();  // -> [N, .., n_select]
    shape.pop_back();
    shape.back() = n_select;
    shape.insert(shape.begin(), N);
    norms = at::empty(shape, M[0].options());
    const at::Tensor rows = norms.view({N * B, n_select});
    for (int64_t i = 0; i < N; ++i) {
      const at::Tensor Mi = M[i].view({B, m, n}), Gi = G[i].view({B, m, n});
      for (int64_t b = 0; b < B; ++b) cpu::accumulate_l1_norms_(Mi[b], Gi[b], rows[i * B + b], select_dim);
    }
  } else {
    for (size_t i = 0; i < M.size(); ++i) M[i].add_(G[i].to(M[i].scalar_type()));  // M += G
    if (n_select == 0) {                                                           // an empty shard: nothing to select
      for (const at::Tensor& m : M) {
        out.U.push_back(m.to(comm_dtype));
        out.indices.push_back(at::empty({0}, m.options().dtype(at::kLong)));
      }
      return out;
    }
    M_stacked = at::stack(M, 0);  // [N, .., m, n]
    norms = at::linalg_vector_norm(M_stacked, 1, at::IntArrayRef{norm_dim}, false);
  }
  if (sum_norms) sum_norms(norms);  // partial norms of slices split across ranks -> whole
  at::Tensor indices = std::get<1>(at::topk(norms, k_topk, -1, /*largest=*/true, /*sorted=*/false));
  std::vector<at::Tensor> idx_list = indices.unbind(0);
  if (fused) {
    std::vector<int64_t> shape = M[0].sizes().vec();  // [N, .., k, n] | [N, .., m, k]
    shape[shape.size() + select_dim] = k_topk;
    shape.insert(shape.begin(), N);
    at::Tensor U = at::empty(shape, M[0].options().dtype(comm_dtype));
    const int64_t u_rows = select_dim == -2 ? k_topk : m, u_cols = select_dim == -2 ? n : k_topk;
    for (int64_t i = 0; i < N; ++i) {
      const at::Tensor Mi = M[i].view({B, m, n}), Ii = idx_list[size_t(i)].view({B, k_topk});
      const at::Tensor Ui = U[i].view({B, u_rows, u_cols});
      for (int64_t b = 0; b < B; ++b) cpu::take_selected_(Mi[b], Ii[b], Ui[b], ef_decay, select_dim);
    }
    out.U = U.unbind(0);
    out.indices = std::move(idx_list);
    return out;
  }
  at::Tensor selected = at::gather(M_stacked, select_dim, expand_index(indices, M_stacked, select_dim));
  std::vector<at::Tensor> sel_list = selected.unbind(0);
  for (size_t i = 0; i < M.size(); ++i) {  // error feedback on the selected slices
    M[i].scatter_(select_dim, expand_index(idx_list[i], M[i], select_dim), sel_list[i] * f32(ef_decay));
  }
  out.U = selected.to(comm_dtype).unbind(0);
  out.indices = std::move(idx_list);
  return out;
}

std::vector<at::Tensor> dion2_take_selected(at::TensorList M, at::TensorList indices, float ef_decay,
                                            int64_t select_dim) {
  std::vector<at::Tensor> U;
  for (size_t i = 0; i < M.size(); ++i) {
    at::Tensor sel = M[i].index_select(select_dim, indices[i]);     // [c, n] or [m, c]
    M[i].index_copy_(select_dim, indices[i], sel * f32(ef_decay));  // error feedback
    U.push_back(sel);
  }
  return U;
}

void dion2_post(at::TensorList X, at::TensorList U, at::TensorList indices, const Rates& r, int64_t select_dim) {
  RECORD_USER_SCOPE("dion::dion2_post");
  const at::Tensor decay = r.decay_t();
  const at::Tensor neg_lr = r.neg_adjusted_lr_t();
  for (size_t i = 0; i < X.size(); ++i) {
    const int64_t d = X[i].dim();
    if (!r.on_device() && d >= 2 && X[i].numel() > 0 && U[i].dim() == d && indices[i].dim() == d - 1 && cpu::cpu_fusable(X[i], X[i]) &&
        cpu::cpu_fusable(U[i], U[i]) && indices[i].device().is_cpu() && indices[i].is_contiguous()) {
      // One pass per matrix (a 3-D+ X: each of its [m, n]), bit-identical to the decay and
      // scatter_add_ below (dion/math/elementwise.h).
      const int64_t m = X[i].size(-2), n = X[i].size(-1), B = X[i].numel() / (m * n);
      const at::Tensor Xi = X[i].view({B, m, n}), Ui = U[i].view({B, U[i].size(-2), U[i].size(-1)});
      const at::Tensor Ii = indices[i].view({B, indices[i].size(-1)});
      for (int64_t b = 0; b < B; ++b)
        cpu::decay_and_update_selected_(Xi[b], Ui[b], Ii[b], r.decay(), -r.adjusted_lr, select_dim);
      continue;
    }
    scale_(X[i], decay);
    at::Tensor u = scale(U[i].to(X[i].scalar_type()), neg_lr);
    X[i].scatter_add_(select_dim, expand_index(indices[i], u, select_dim), u);
  }
}

}  // namespace dion::math

namespace dion::math {

std::vector<at::Tensor> dion2_accumulate(at::TensorList G, at::TensorList M, at::ScalarType comm_dtype) {
  std::vector<at::Tensor> U;
  for (size_t i = 0; i < M.size(); ++i) {
    M[i].add_(G[i].to(M[i].scalar_type()));
    U.push_back(M[i].to(comm_dtype));
  }
  return U;
}

OrthoFn dion2_select_then(OrthoFn orthogonalize, double fraction, int64_t select_dim, int64_t global_select_size) {
  return [orthogonalize = std::move(orthogonalize), fraction, select_dim, global_select_size](const at::Tensor& X,
                                                                                              double epsilon) {
    const int64_t n_select = global_select_size > 0 ? global_select_size : X.size(select_dim);
    const int64_t norm_dim = select_dim == -2 ? -1 : -2;
    const int64_t k = std::min(dion2_num_selected(fraction, n_select), X.size(select_dim));
    at::Tensor norms = at::linalg_vector_norm(X, 1, at::IntArrayRef{norm_dim}, false);
    at::Tensor idx = std::get<1>(at::topk(norms, k, -1, true, false));
    at::Tensor idx_exp = expand_index(idx, X, select_dim);
    at::Tensor sub = at::gather(X, select_dim, idx_exp);
    at::Tensor ortho = orthogonalize(sub, epsilon);
    return at::zeros_like(X).scatter_(select_dim, idx_exp, ortho.to(X.scalar_type()));
  };
}

void dion2_post_masked(at::TensorList X, at::TensorList M, at::TensorList U, const Rates& r, float ef_decay,
                       int64_t select_dim) {
  const int64_t norm_dim = select_dim == -2 ? -1 : -2;
  const at::Tensor decay = r.decay_t();
  const at::Tensor neg_lr = r.neg_adjusted_lr_t();
  for (size_t i = 0; i < X.size(); ++i) {
    // On the GPU, decay and update in one kernel (opt-in: dion/math/own_kernels.h),
    // bit-identical to the two ops below — except for bf16 X with float32 U, where the ops round
    // the product to bf16 before the add.
    const bool fused =
        own_fused_kernel(X[i], U[i]) && !(X[i].scalar_type() == at::kBFloat16 && U[i].scalar_type() == at::kFloat);
    if (!fused) scale_(X[i], decay);
    at::Tensor sel = U[i].to(at::kFloat).abs().sum(norm_dim, /*keepdim=*/true) > 0;
    at::Tensor ef = f32(ef_decay).to(M[i].scalar_type());
    M[i].mul_(at::where(sel, ef, at::ones({}, M[i].options())));
    if (fused && r.on_device() && r.lr_dev.device() == X[i].device()) {
      cuda::decay_and_update_(X[i], U[i], decay, neg_lr);  // reads the values on the device
    } else if (fused) {
      cuda::decay_and_update_(X[i], U[i], r.decay(), -r.adjusted_lr);
    } else {
      X[i].add_(scale(U[i], neg_lr).to(X[i].scalar_type()));
    }
  }
}

}  // namespace dion::math
