// src/train/kernels.cpp — the exact and fast GEMMs and lm_head + cross entropy (kernels.h).
#include "dion/train/kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <atomic>
#include <optional>

#include "dion/train/autocast.h"

namespace dion::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// oneDNN's linear as LibTorch registers it (aten/src/ATen/native/mkldnn/Linear.cpp, the op
// torch.compile's CPU backend calls): Y = X W^T with W [out, in]; no post-op.
const c10::OperatorHandle* onednn_linear_op() {
  static const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op ? &*op : nullptr;
}

std::atomic<bool> onednn_bf16_refused{false};  // this CPU's oneDNN has no bf16 GEMM: at::mm instead

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w) {
  torch::jit::Stack stack{x, w, c10::IValue(), c10::IValue("none"),
                          c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string())};
  onednn_linear_op()->callBoxed(&stack);
  return stack[0].toTensor();
}

// Inside the fused functions every dtype is chosen explicitly: no autocast re-casting.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

// x, w cast to the dtype autocast would compute a linear in (differentiably; no-op when off).
std::pair<at::Tensor, at::Tensor> autocast_pair(const at::Tensor& x, const at::Tensor& w) {
  const std::optional<c10::ScalarType> dt = autocast_dtype(x.device().type());
  if (!dt || !at::isFloatingType(x.scalar_type())) return {x, w};
  return {x.to(*dt), w.to(*dt)};
}

struct FastLinearFn : torch::autograd::Function<FastLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    NoAutocast no_autocast;
    ctx->save_for_backward({x, w});
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return matmul_2d(x.reshape({-1, x.size(-1)}), w.t(), Kernels::fast).view(sizes);  // [.., out]
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor dy = grads[0].reshape({-1, grads[0].size(-1)});  // [N, out]
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = matmul_2d(dy, w, Kernels::fast).view(x.sizes());  // [.., in]
    if (ctx->needs_input_grad(1)) dw = matmul_2d(dy.t(), x.reshape({-1, x.size(-1)}), Kernels::fast);  // [out, in]
    return {dx, dw};
  }
};

// The fused, chunked lm_head + cross entropy. Forward: per chunk of rows, logits [n, V] (in h's
// dtype, then fp32), their logsumexp, the chunk's summed loss; with `want_grad`, the logits
// become (softmax - onehot) / n_valid in place, cast to h's dtype, and give dh (rows of the
// chunk) and dW (accumulated in fp32). Backward scales the kept dh, dW by the loss's gradient.
struct LinearCrossEntropyFn : torch::autograd::Function<LinearCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets,
                            int64_t ignore_index, bool want_grad) {
    NoAutocast no_autocast;
    const int64_t N = h.size(0), V = w.size(0);
    const auto f32 = h.options().dtype(at::kFloat);
    const at::Tensor valid = targets.ne(ignore_index);                 // [N] bool
    const at::Tensor safe_targets = targets.masked_fill(valid.logical_not(), 0).unsqueeze(1);  // [N, 1]
    const at::Tensor n_valid = valid.sum().to(at::kFloat);            // 0-dim; 0 gives nan, as F.cross_entropy
    const at::Tensor row_scale = valid.to(at::kFloat).div(n_valid).unsqueeze(1);  // [N, 1]: 1/n_valid or 0
    at::Tensor loss_sum = at::zeros({}, f32);
    at::Tensor dh, dw;
    if (want_grad) {
      dh = at::empty_like(h);
      dw = at::zeros({V, h.size(1)}, f32);
    }
    for (int64_t s = 0; s < N; s += kCrossEntropyChunkRows) {
      const int64_t n = std::min(kCrossEntropyChunkRows, N - s);
      const at::Tensor hc = h.narrow(0, s, n), tc = safe_targets.narrow(0, s, n);
      at::Tensor lg = matmul_2d(hc, w.t(), Kernels::fast);            // [n, V]
      if (lg.scalar_type() != at::kFloat) lg = lg.to(at::kFloat);     // the reference's logits.float()
      const at::Tensor lse = at::logsumexp(lg, {1}, /*keepdim=*/true);  // [n, 1]
      loss_sum.add_(at::where(valid.narrow(0, s, n), (lse - lg.gather(1, tc)).squeeze(1), 0.0).sum());
      if (!want_grad) continue;
      lg.sub_(lse).exp_();                                             // softmax
      lg.scatter_add_(1, tc, at::full({n, 1}, -1.0, f32));             // - onehot(target)
      lg.mul_(row_scale.narrow(0, s, n));
      const at::Tensor p = lg.to(h.scalar_type());                     // d loss / d logits, [n, V]
      dh.narrow(0, s, n).copy_(matmul_2d(p, w, Kernels::fast));        // [n, C]
      dw.add_(matmul_2d(p.t(), hc, Kernels::fast));                    // [V, C]
    }
    if (want_grad) ctx->save_for_backward({dh, dw.to(w.scalar_type())});
    return loss_sum.div(n_valid);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    TORCH_CHECK(!saved.empty(), "linear_cross_entropy: backward of a forward that ran without gradients");
    const at::Tensor g = grads[0];
    return {saved[0] * g.to(saved[0].scalar_type()), saved[1] * g.to(saved[1].scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool onednn_linear_available() { return onednn_linear_op() != nullptr; }

at::Tensor matmul_2d(const at::Tensor& a, const at::Tensor& b, Kernels kind) {
  const bool cpu_float = a.device().is_cpu() && a.scalar_type() == b.scalar_type() &&
                         (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16);
  if (kind == Kernels::fast && cpu_float && onednn_linear_available() &&
      !(a.scalar_type() == at::kBFloat16 && onednn_bf16_refused.load())) {
    try {
      return onednn_linear(a, b.t());
    } catch (const c10::Error&) {
      if (a.scalar_type() != at::kBFloat16) throw;
      onednn_bf16_refused.store(true);  // e.g. a CPU without AVX-512 BF16 / AMX: ATen's bf16 GEMM
    }
  }
  return at::mm(a, b);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, Kernels kind) {
  if (kind == Kernels::exact) return at::linear(x, w);
  auto [xc, wc] = autocast_pair(x, w);
  return FastLinearFn::apply(xc, wc);
}

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets, Kernels kind,
                                int64_t ignore_index) {
  TORCH_CHECK(h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1) && targets.dim() == 1 &&
                  targets.size(0) == h.size(0),
              "linear_cross_entropy: h [N, C], w [V, C], targets [N]; got h ", h.sizes(), ", w ", w.sizes(),
              ", targets ", targets.sizes());
  if (kind == Kernels::exact)
    return at::cross_entropy_loss(at::linear(h, w).to(at::kFloat), targets, /*weight=*/{}, at::Reduction::Mean,
                                  ignore_index);
  auto [hc, wc] = autocast_pair(h, w);
  const bool want_grad = at::GradMode::is_enabled() && (hc.requires_grad() || wc.requires_grad());
  return LinearCrossEntropyFn::apply(hc, wc, targets, ignore_index, want_grad);
}

}  // namespace dion::train
