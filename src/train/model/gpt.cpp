// src/train/model/gpt.cpp — the reference's GPT forward pass and initialization (gpt.h).
//
// Each operation is the one the reference's PyTorch code calls (F.rms_norm with eps=None,
// F.scaled_dot_product_attention(is_causal=True), F.cross_entropy(ignore_index=-1)), in the same
// order, so that fp32 CPU results agree with the reference's to rounding (tests/train). With
// Kernels::fast the linears and the lm_head + loss go through dion/train/kernels.h instead, the
// rotary and relu^2 through one-pass kernels of the same bits, the RMSNorm through one of
// fp32 rounding (fused_cpu.h), and bf16 attention at short sequences through ATen's fp32 one
// (causal_attention).
#include "dion/train/gpt.h"

#include "dion/train/moe.h"
#include "fused_cpu.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>
#include <tuple>

namespace dion::train {

namespace {
// F.rms_norm(x, (x.size(-1),)), eps = finfo.eps: ATen's, or in the fast kind on the CPU one pass
// each way (fused_cpu.h; equal to fp32 rounding).
at::Tensor rms_norm_last(Kernels kind, const at::Tensor& x) {
  return kind == Kernels::fast && fused_available(x) ? rms_norm_fused(x) : at::rms_norm(x, {x.size(-1)});
}
// The weight a layer computes with: the parameter itself, or what the parallel layout makes of it.
at::Tensor weight_of(ModelParallel* par, const at::Tensor& w) { return par ? par->weight(w) : w; }
// nn.Linear without bias (exact: the same at::linear call torch::nn::Linear makes).
at::Tensor linear(ModelParallel* par, Kernels kind, const torch::nn::Linear& l, const at::Tensor& x) {
  return par ? par->linear(x, l->weight) : dion::train::linear(x, l->weight, kind);
}
// A placeholder of w's shape that holds one element (GPTConfig::placeholder_weights).
void make_placeholder(at::Tensor& w) {
  at::NoGradGuard no_grad;
  w.set_data(at::zeros({}, w.options()).expand(w.sizes()));
}
at::Tensor tp_enter(ModelParallel* par, const at::Tensor& x) { return par ? par->tp_enter(x) : x; }
at::Tensor tp_exit(ModelParallel* par, const at::Tensor& x) { return par ? par->tp_exit(x) : x; }
// The fast kind's rotary and relu^2: one pass each on the CPU, the same bits (fused_cpu.h); ATen's
// composition elsewhere and in the exact kind.
at::Tensor rotary(Kernels kind, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return kind == Kernels::fast && rotary_fused_available(x, cos) ? rotary_fused(x, cos, sin)
                                                                 : apply_rotary(x, cos, sin);
}
at::Tensor relu_square(Kernels kind, const at::Tensor& a) {
  return kind == Kernels::fast && fused_available(a) ? relu_square_fused(a) : at::relu(a).square();
}
}  // namespace

at::Tensor ModelParallel::linear(const at::Tensor& x, const at::Tensor& param) {
  return dion::train::linear(x, weight(param), kernels);
}

ModelParallel::Pending ModelParallel::ep_start(const at::Tensor& x, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) {
  return [x] { return x; };
}

ModelParallel::Pending ModelParallel::ep_start_counts(const at::Tensor& counts) {
  return [counts] { return counts; };
}

// ---------------------------------------------------------------------------- rotary

std::pair<at::Tensor, at::Tensor> rotary_cos_sin(int64_t T, int64_t D, at::Device device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // inv_freq = 1 / (10000 ** (arange(0, D, 2).float() / D))   [D/2]
  at::Tensor inv_freq = at::reciprocal(at::pow(10000, at::arange(0, D, 2, f32) / D));
  at::Tensor t = at::arange(T, f32);                     // [T]
  at::Tensor freqs = at::outer(t, inv_freq).to(device);  // [T, D/2]
  return {freqs.cos().to(at::kBFloat16), freqs.sin().to(at::kBFloat16)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t d = x.size(3) / 2;
  at::Tensor c = cos.unsqueeze(0).unsqueeze(2);  // [1, T, 1, D/2]
  at::Tensor s = sin.unsqueeze(0).unsqueeze(2);
  at::Tensor x1 = x.slice(3, 0, d), x2 = x.slice(3, d);
  at::Tensor y1 = x1 * c + x2 * s;
  at::Tensor y2 = x1 * (-s) + x2 * c;
  return at::cat({y1, y2}, 3).to(x.scalar_type());
}

// ---------------------------------------------------------------------------- modules

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& cfg)
    : n_head_(cfg.n_head),
      head_dim_(cfg.n_embd / cfg.n_head),
      kernels_(cfg.kernels),
      qk_norm_(cfg.qk_norm),
      track_(cfg.track_max_logits) {
  auto lin = [&](const char* name) {
    return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, cfg.n_embd).bias(false)));
  };
  c_q = lin("c_q");
  c_k = lin("c_k");
  c_v = lin("c_v");
  c_proj = lin("c_proj");
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  ModelParallel* par = parallel.get();
  const int64_t H = n_head_ / (par ? par->tp_size() : 1);  // this rank's heads
  const at::Tensor xt = tp_enter(par, x);
  at::Tensor q = linear(par, kernels_, c_q, xt).view({B, T, H, head_dim_});  // [B, T, H, D]
  at::Tensor k = linear(par, kernels_, c_k, xt).view({B, T, H, head_dim_});
  at::Tensor v = linear(par, kernels_, c_v, xt).view({B, T, H, head_dim_});
  if (!cos_.defined() || cos_.size(0) != T || cos_.device() != x.device())
    std::tie(cos_, sin_) = rotary_cos_sin(T, head_dim_, x.device());
  q = rotary(kernels_, q, cos_, sin_);
  k = rotary(kernels_, k, cos_, sin_);
  if (qk_norm_) {
    q = rms_norm_last(kernels_, q);
    k = rms_norm_last(kernels_, k);
  }
  if (track_ && is_training()) track_max_logits(q, k);
  at::Tensor y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kernels_);
  y = y.transpose(1, 2).contiguous().view({B, T, -1});    // [B, T, C / tp]
  return tp_exit(par, linear(par, kernels_, c_proj, y));  // [B, T, C]
}

// The largest causal q . k / sqrt(D) of each head over this forward's batch, kept as a running max.
void CausalSelfAttentionImpl::track_max_logits(const at::Tensor& q, const at::Tensor& k) {
  at::NoGradGuard no_grad;
  const int64_t T = q.size(1);
  at::Tensor s = at::matmul(q.transpose(1, 2).to(at::kFloat), k.transpose(1, 2).to(at::kFloat).transpose(2, 3));
  s = s.div_(std::sqrt(double(head_dim_)))  // [B, H, T, T], the softmax's input
          .masked_fill_(at::ones({T, T}, s.options().dtype(at::kBool)).triu(1), -INFINITY);
  at::Tensor m = std::get<0>(s.transpose(0, 1).flatten(1).max(1));  // [H]
  max_logits_ = max_logits_.defined() ? at::maximum(max_logits_, m) : m;
}

at::Tensor CausalSelfAttentionImpl::take_max_logits() {
  const int64_t H = n_head_ / (parallel ? parallel->tp_size() : 1);
  at::Tensor out = max_logits_.defined() ? max_logits_ : at::full({H}, -INFINITY, at::kFloat);
  max_logits_ = at::Tensor();
  return out;
}

MLPImpl::MLPImpl(const GPTConfig& cfg, int64_t hidden) : kernels_(cfg.kernels) {
  if (hidden == 0) hidden = 4 * cfg.n_embd;
  c_fc = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, hidden).bias(false)));
  c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, cfg.n_embd).bias(false)));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  ModelParallel* par = parallel.get();
  at::Tensor h = relu_square(kernels_, linear(par, kernels_, c_fc, tp_enter(par, x)));  // [B, T, 4C / tp]
  return tp_exit(par, linear(par, kernels_, c_proj, h));
}

BlockImpl::BlockImpl(const GPTConfig& cfg, int64_t layer) : kernels_(cfg.kernels) {
  attn = register_module("attn", CausalSelfAttention(cfg));
  if (cfg.moe.on_layer(layer))
    moe = register_module("mlp", std::make_shared<MoEImpl>(cfg));
  else
    mlp = register_module("mlp", MLP(cfg));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor y = x + attn(rms_norm_last(kernels_, x));
  return y + (moe ? moe->forward(rms_norm_last(kernels_, y)) : mlp(rms_norm_last(kernels_, y)));
}

GPTImpl::GPTImpl(const GPTConfig& cfg) : config_(cfg) {
  transformer_ = register_module("transformer", std::make_shared<torch::nn::Module>("transformer"));
  wte = transformer_->register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.n_embd));
  h = transformer_->register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks_.push_back(Block(cfg, i));
    h->push_back(blocks_.back());
  }
  lm_head =
      register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, cfg.vocab_size).bias(false)));
  if (cfg.placeholder_weights)
    for (at::Tensor& p : parameters()) make_placeholder(p);
}

void GPTImpl::init_weights(const KeepFn& keep) {
  at::NoGradGuard no_grad;
  // Each weight drawn whole into a fresh tensor (the same draws as normal_ in place), then kept
  // (or cut) before the next is drawn.
  auto draw = [&](const std::string& name, at::Tensor& w, double std) {
    at::Tensor full = at::empty(w.sizes(), w.options().memory_format(at::MemoryFormat::Contiguous)).normal_(0.0, std);
    w.set_data(keep ? keep(name, full) : full);
  };
  // The rule on [.., out, in]: every expert's matrix of a stack as one Linear.
  auto init_matrix = [&](const std::string& name, at::Tensor& w) {
    const double fan_out = double(w.size(-2)), fan_in = double(w.size(-1));
    draw(name, w, 1.0 / std::sqrt(fan_in) * std::min(1.0, std::sqrt(fan_out / fan_in)));
  };
  auto init_linear = [&](const std::string& name, torch::nn::Linear& l) { init_matrix(name, l->weight); };
  // The reference's Module.apply order: children first, depth first, in registration order.
  draw("transformer.wte.weight", wte->weight, 1.0);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    const std::string pre = "transformer.h." + std::to_string(i) + ".";
    init_linear(pre + "attn.c_q.weight", b->attn->c_q);
    init_linear(pre + "attn.c_k.weight", b->attn->c_k);
    init_linear(pre + "attn.c_v.weight", b->attn->c_v);
    init_linear(pre + "attn.c_proj.weight", b->attn->c_proj);
    if (b->moe) {
      init_linear(pre + "mlp.router.weight", b->moe->router);
      init_matrix(pre + "mlp.experts.w1", b->moe->w1);
      init_matrix(pre + "mlp.experts.w2", b->moe->w2);
      if (b->moe->shared) {
        init_linear(pre + "mlp.shared.c_fc.weight", b->moe->shared->c_fc);
        init_linear(pre + "mlp.shared.c_proj.weight", b->moe->shared->c_proj);
      }
      continue;
    }
    init_linear(pre + "mlp.c_fc.weight", b->mlp->c_fc);
    init_linear(pre + "mlp.c_proj.weight", b->mlp->c_proj);
  }
  init_linear("lm_head.weight", lm_head);
}

void GPTImpl::set_parallel(std::shared_ptr<ModelParallel> parallel) {
  parallel_ = parallel;
  if (parallel_) parallel_->kernels = config_.kernels;
  for (Block& b : blocks_) {
    b->attn->parallel = parallel;
    if (b->mlp) b->mlp->parallel = parallel;
    if (b->moe) {
      b->moe->parallel = parallel;
      if (b->moe->shared) b->moe->shared->parallel = parallel;
    }
  }
}

at::Tensor GPTImpl::hidden(const at::Tensor& idx) {
  at::Tensor x = at::embedding(weight_of(parallel_.get(), wte->weight), idx);  // [B, T, C] (as nn.Embedding)
  for (Block& b : blocks_) x = b(x);
  return rms_norm_last(config_.kernels, x);
}

at::Tensor GPTImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  at::Tensor loss;
  if (config_.kernels == Kernels::fast) {  // the lm_head and the loss fused; no [B, T, V] logits
    const at::Tensor h = hidden(idx);
    loss = linear_cross_entropy(h.view({-1, h.size(-1)}), weight_of(parallel_.get(), lm_head->weight),
                                targets.view({-1}), Kernels::fast, /*ignore_index=*/-1);
  } else {
    at::Tensor logits =
        linear(parallel_.get(), Kernels::exact, lm_head, hidden(idx)).to(at::kFloat);  // [B, T, V] fp32
    loss = at::cross_entropy_loss(logits.view({-1, logits.size(-1)}), targets.view({-1}), /*weight=*/{},
                                  at::Reduction::Mean, /*ignore_index=*/-1);
  }
  for (const auto& m : moe_layers())  // the MoE balance loss, while training (moe.h)
    if (m->aux_loss().defined()) loss = loss + m->aux_loss();
  return loss;
}

std::vector<std::shared_ptr<MoEImpl>> GPTImpl::moe_layers() const {
  std::vector<std::shared_ptr<MoEImpl>> out;
  for (const Block& b : blocks_)
    if (b->moe) out.push_back(b->moe);
  return out;
}

std::vector<at::Tensor> GPTImpl::router_params() {
  std::vector<at::Tensor> out;
  for (const auto& m : moe_layers()) out.push_back(m->router->weight);
  return out;
}

std::vector<CausalSelfAttention> GPTImpl::attentions() const {
  std::vector<CausalSelfAttention> out;
  for (const Block& b : blocks_) out.push_back(b->attn);
  return out;
}

at::Tensor GPTImpl::take_expert_load() {
  std::vector<at::Tensor> rows;
  for (const auto& m : moe_layers()) rows.push_back(m->take_load());
  return rows.empty() ? at::zeros({0, 0}, at::kLong) : at::stack(rows);
}

double GPTImpl::take_route_seconds() {
  double s = 0;
  for (const auto& m : moe_layers()) s += m->take_route_seconds();
  return s;
}

void GPTImpl::update_expert_bias(const at::Tensor& load, double rate) {
  at::NoGradGuard no_grad;
  const auto layers = moe_layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const at::Tensor l = load[int64_t(i)].to(at::kFloat);
    at::Tensor delta = at::sign(l.mean() - l) * rate;
    delta = delta - delta.mean();
    layers[i]->expert_bias.add_(delta.to(layers[i]->expert_bias.device()));
  }
}

at::Tensor GPTImpl::logits(const at::Tensor& idx) {
  return linear(parallel_.get(), config_.kernels, lm_head, hidden(idx)).to(at::kFloat);
}

std::vector<at::Tensor> GPTImpl::block_params() { return h->parameters(); }

namespace {
int64_t param_count(const GPTConfig& c, bool active) {
  const int64_t C = c.n_embd, attn = 4 * C * C, mlp = 2 * 4 * C * C;
  const MoEConfig& m = c.moe;
  const int64_t H = m.expert_dim;
  const int64_t routed = (active ? m.top_k : m.n_experts) * 2 * H * C;
  const int64_t moe = m.n_experts * C + routed + m.n_shared_experts * 2 * H * C;
  int64_t n = 2 * c.vocab_size * C;
  for (int64_t i = 0; i < c.n_layer; ++i) n += attn + (m.on_layer(i) ? moe : mlp);
  return n;
}
}  // namespace

int64_t gpt_param_count(const GPTConfig& c) { return param_count(c, false); }
int64_t gpt_active_param_count(const GPTConfig& c) { return param_count(c, true); }

}  // namespace dion::train
