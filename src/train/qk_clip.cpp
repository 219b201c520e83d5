// dion-train's QK-clip over the layout's parts of c_q and c_k (src/train/qk_clip.h).
#include "qk_clip.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "dion/optim/distributed.h"

namespace dion::train {
namespace {

// The global rows of this rank's part of `w` (its box along dim 0).
at::Tensor rows_of(const at::Tensor& w, Parallel& par) {
  const Box b = par.box(w);
  return at::arange(b.start[0], b.start[0] + b.length[0], at::kLong);
}

}  // namespace

TrainQkClip::TrainQkClip(double tau, GPT model, Parallel& par) : model_(std::move(model)), par_(par) {
  const GPTConfig& g = model_->config();
  const int64_t D = g.n_embd / g.n_head;
  std::vector<dion::QkClipLayer> layers;
  int64_t i = 0;
  for (CausalSelfAttention a : model_->attentions()) {
    const std::string name = fmt::format("transformer.h.{}.attn", i++);
    layers.push_back({name, a->c_q->weight, a->c_k->weight, rows_of(a->c_q->weight, par), rows_of(a->c_k->weight, par),
                      g.n_head, g.n_head, D});
  }
  if (par.mesh().world_size() > 1)
    world_ = std::make_shared<dion::GroupAxis>(std::shared_ptr<comm::Group>(&par.mesh().world(), [](comm::Group*) {}));
  clip_ = std::make_unique<dion::QkClip>(tau, std::move(layers), world_);
}

at::Tensor TrainQkClip::apply(int64_t step) {
  const GPTConfig& g = model_->config();
  const int64_t tp = par_.tp_size(), H = g.n_head / tp, offset = par_.mesh().coord().tp * H;
  std::vector<at::Tensor> mine;
  for (CausalSelfAttention a : model_->attentions()) {
    at::Tensor all = at::full({g.n_head}, -INFINITY, at::kFloat);
    all.narrow(0, offset, H).copy_(a->take_max_logits().to(at::kCPU, at::kFloat));
    mine.push_back(all);
  }
  at::Tensor S = clip_->apply(mine);  // [n_layer, n_head]
  ++steps_;
  clips_ += (S > clip_->tau()).sum().item<int64_t>();
  const at::Tensor flat = S.flatten();
  const int64_t at = flat.argmax().item<int64_t>();
  const double top = flat[at].item<double>();
  if (top > largest_) {
    largest_ = top;
    largest_step_ = step;
    largest_layer_ = at / S.size(1);
    largest_head_ = at % S.size(1);
  }
  return S;
}

void TrainQkClip::discard() {
  for (CausalSelfAttention a : model_->attentions()) a->take_max_logits();
}

std::string TrainQkClip::summary() const {
  return fmt::format("QK-clip at tau {}: {} head clip(s) over {} step(s), the largest logit {:.4g} (step {}, layer {} "
                     "head {})",
                     clip_->tau(), clips_, steps_, largest_, largest_step_, largest_layer_, largest_head_);
}

}  // namespace dion::train
