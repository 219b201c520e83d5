// QK-clip over the ranks (dion/optim/qk_clip.h).
#include "dion/optim/qk_clip.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <limits>

#include "dion/errors.h"
#include "dion/math/qk_clip.h"

namespace dion {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

void check_weight(const QkClipLayer& l, const char* which, const at::Tensor& w, const at::Tensor& rows,
                  int64_t heads) {
  const std::string where = "QK-clip layer '" + l.name + "' " + which;
  if (!w.defined() || w.dim() != 2)
    throw ValueError(where + ": a 2-D [heads * head_dim, in] weight (or this rank's part of it) is needed, got " +
                     (w.defined() ? shape_of(w) : std::string("none")));
  const int64_t global = heads * l.head_dim;
  if (!rows.defined()) {
    if (w.size(0) != global)
      throw ValueError(where + ": " + shape_of(w) + " has " + std::to_string(w.size(0)) + " rows, but " +
                       std::to_string(heads) + " heads of " + std::to_string(l.head_dim) + " make " +
                       std::to_string(global) + "; a row-sharded weight names its global rows (rows=...)");
    return;
  }
  if (rows.dim() != 1 || rows.size(0) != w.size(0))
    throw ValueError(where + ": rows " + shape_of(rows) + " must give one global row index per local row (" +
                     std::to_string(w.size(0)) + ")");
  if (rows.numel() > 0 && (rows.min().item<int64_t>() < 0 || rows.max().item<int64_t>() >= global))
    throw ValueError(where + ": a global row index is outside 0 .. " + std::to_string(global - 1) + " (" +
                     std::to_string(heads) + " heads of " + std::to_string(l.head_dim) + ")");
}

}  // namespace

QkClip::QkClip(double tau, std::vector<QkClipLayer> layers, std::shared_ptr<AxisGroup> group)
    : tau_(tau), layers_(std::move(layers)), group_(std::move(group)) {
  if (!std::isfinite(tau) || tau <= 0)
    throw ValueError("QK-clip: tau must be a finite logit > 0 (e.g. 100), got " + std::to_string(tau));
  for (const QkClipLayer& l : layers_) {
    if (l.n_heads < 1 || l.n_kv_heads < 1 || l.head_dim < 1 || l.n_heads % l.n_kv_heads != 0)
      throw ValueError("QK-clip layer '" + l.name + "': n_heads " + std::to_string(l.n_heads) + ", n_kv_heads " +
                       std::to_string(l.n_kv_heads) + ", head_dim " + std::to_string(l.head_dim) +
                       ": all >= 1, and n_kv_heads must divide n_heads");
    check_weight(l, "wq", l.wq, l.wq_rows, l.n_heads);
    check_weight(l, "wk", l.wk, l.wk_rows, l.n_kv_heads);
    width_ = std::max(width_, l.n_heads);
  }
}

at::Tensor QkClip::apply(const std::vector<at::Tensor>& max_logits) {
  at::NoGradGuard no_grad;  // the weights are parameters: scaled in place like an optimizer step
  const int64_t L = static_cast<int64_t>(layers_.size());
  if (static_cast<int64_t>(max_logits.size()) != L)
    throw ValueError("QK-clip: " + std::to_string(max_logits.size()) + " max-logit vectors for " + std::to_string(L) +
                     " layers; give one [n_heads] vector a layer, in the order the layers were given");
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor packed = at::full({L, width_}, neg_inf, at::kFloat);
  for (int64_t i = 0; i < L; ++i) {
    const QkClipLayer& l = layers_[static_cast<size_t>(i)];
    const at::Tensor& s = max_logits[static_cast<size_t>(i)];
    if (!s.defined() || s.numel() != l.n_heads)
      throw ValueError("QK-clip layer '" + l.name + "': max logits " + (s.defined() ? shape_of(s) : "none") +
                       ", need one a query head (" + std::to_string(l.n_heads) + ")");
    packed[i].narrow(0, 0, l.n_heads).copy_(s.detach().reshape({-1}).to(at::kCPU, at::kFloat));
  }
  if (group_ && group_->size() > 1) {  // one collective for every layer: the max over the ranks
    at::Tensor all = group_->all_gather(packed.to(group_->control_device()));  // [W, L, H]
    packed = std::get<0>(all.max(0)).to(at::kCPU);
  }
  for (int64_t i = 0; i < L; ++i) {  // after the gather: every rank sees the same values and throws alike
    const QkClipLayer& l = layers_[static_cast<size_t>(i)];
    const at::Tensor s = packed[i].narrow(0, 0, l.n_heads);
    const at::Tensor bad = at::isnan(s).logical_or(at::isposinf(s));
    if (at::any(bad).item<bool>()) {
      const int64_t h = bad.nonzero()[0][0].item<int64_t>();
      throw ValueError("QK-clip layer '" + l.name + "' head " + std::to_string(h) + ": the largest attention logit is " +
                       std::to_string(s[h].item<float>()) + " (the forward diverged); no weight was scaled");
    }
  }
  for (int64_t i = 0; i < L; ++i) {
    QkClipLayer& l = layers_[static_cast<size_t>(i)];
    const at::Tensor gamma = math::qk_clip_factors(packed[i].narrow(0, 0, l.n_heads), tau_);
    if (l.n_kv_heads == l.n_heads) {
      math::scale_head_rows_(l.wq, l.wq_rows, gamma, l.head_dim, 0.5);
      math::scale_head_rows_(l.wk, l.wk_rows, gamma, l.head_dim, 0.5);
    } else {
      math::scale_head_rows_(l.wq, l.wq_rows, gamma, l.head_dim, 1.0);
    }
  }
  return packed;
}

}  // namespace dion
