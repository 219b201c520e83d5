// src/train/model/moe.cpp — the mixture-of-experts feed-forward (moe.h).
#include "dion/train/moe.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace dion::train {

namespace {
std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}
}  // namespace

MoEImpl::MoEImpl(const GPTConfig& cfg) : cfg_(cfg.moe), hidden_(cfg.moe.expert_dim), kernels_(cfg.kernels) {
  const int64_t E = cfg_.n_experts, C = cfg.n_embd;
  if (E < 1 || cfg_.top_k < 1 || cfg_.top_k > E || hidden_ < 1)
    throw std::invalid_argument("MoE: n_experts " + std::to_string(E) + ", top_k " + std::to_string(cfg_.top_k) +
                                ", expert_dim " + std::to_string(hidden_) +
                                ": valid n_experts >= 1, 1 <= top_k <= n_experts, expert_dim >= 1");
  router = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(C, E).bias(false)));
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>("experts"));
  w1 = experts->register_parameter("w1", at::empty({E, hidden_, C}));
  w2 = experts->register_parameter("w2", at::empty({E, C, hidden_}));
  if (cfg_.n_shared_experts > 0) shared = register_module("shared", MLP(cfg, cfg_.n_shared_experts * hidden_));
  expert_bias = register_buffer("expert_bias", at::zeros({E}, at::kFloat));
}

double MoEImpl::take_route_seconds() {
  const double s = route_s_;
  route_s_ = 0;
  return s;
}

at::Tensor MoEImpl::take_load() {
  at::Tensor out = load_.defined() ? load_ : at::zeros({cfg_.n_experts}, at::kLong);
  load_ = at::Tensor();
  return out;
}

at::Tensor MoEImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), E = cfg_.n_experts, K = cfg_.top_k;
  ModelParallel* par = parallel.get();
  const at::Tensor xf = x.reshape({B * T, C});
  const at::Tensor rw = par ? par->weight(router->weight) : router->weight;
  const at::Tensor logits = linear(xf, rw, kernels_).to(at::kFloat);  // [N, E], routing in fp32
  const at::Tensor scores = cfg_.sigmoid ? logits.sigmoid() : logits.softmax(-1);
  at::Tensor sel;  // [N, K] expert ids
  {
    at::NoGradGuard no_grad;
    sel = std::get<1>(at::topk(scores.detach() + expert_bias, K, -1, /*largest=*/true, /*sorted=*/true));
    if (is_training()) {  // the step's load (validation's forwards do not count)
      const at::Tensor counts = at::bincount(sel.reshape({-1}).cpu(), {}, E);
      load_ = load_.defined() ? load_ + counts : counts;
    }
  }
  at::Tensor w = scores.gather(1, sel);
  w = w / w.sum(-1, /*keepdim=*/true);  // renormalised over the chosen experts
  aux_loss_ = at::Tensor();
  if (is_training() && cfg_.aux_loss_coef > 0) {
    // DeepSeek-V3's sequence-wise balance loss: per sequence, sum_i f_i P_i.
    const at::Tensor probs = cfg_.sigmoid ? scores / scores.sum(-1, true) : scores;
    const at::Tensor P = probs.view({B, T, E}).mean(1);  // [B, E]
    at::Tensor f = at::zeros({B, E}, scores.options());
    f = f.scatter_add(1, sel.view({B, T * K}), at::ones({B, T * K}, scores.options())) * (double(E) / double(K * T));
    aux_loss_ = (f * P).sum(1).mean() * cfg_.aux_loss_coef;
  }
  // The shared experts compute while the routed tokens travel (expert parallelism).
  at::Tensor y_shared;
  at::Tensor y = routed(xf, sel, w, [&] {
                   if (shared) y_shared = shared(x);
                 }).view({B, T, C});
  if (shared) y = y + y_shared;
  return y;
}

at::Tensor MoEImpl::routed(const at::Tensor& xf, const at::Tensor& sel, const at::Tensor& w,
                           const std::function<void()>& meanwhile) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Clock::duration experts{0};  // the grouped GEMMs: not routing
  auto run_experts = [&](const at::Tensor& rows, const std::vector<int64_t>& counts) {
    const auto t = Clock::now();
    at::Tensor y = grouped(rows, counts, 0);
    experts += Clock::now() - t;
    return y;
  };
  auto overlapped = [&] {  // not routing either
    const auto t = Clock::now();
    meanwhile();
    experts += Clock::now() - t;
  };
  const int64_t E = cfg_.n_experts, K = cfg_.top_k;
  const at::Tensor flat = sel.reshape({-1});                           // [N K]
  const at::Tensor order = at::argsort(flat, /*stable=*/true, 0);      // grouped by expert, token order inside
  const at::Tensor token = at::div(order, K, "floor");                 // the token of each routed row
  const std::vector<int64_t> counts = to_vector(at::bincount(flat.cpu(), {}, E));  // rows per expert
  const at::Tensor xs = xf.index_select(0, token);                     // [N K, C]
  ModelParallel* par = parallel.get();
  const int64_t ep = par ? par->ep_size() : 1;
  at::Tensor ys;
  if (ep == 1) {
    overlapped();
    ys = run_experts(xs, counts);
  } else {
    // Counts first: recv_counts[s * El + e] = rows rank s sends to my local expert e.
    const int64_t El = E / ep;
    const std::vector<int64_t> rc = to_vector(par->ep_exchange_counts(at::tensor(counts, at::kLong)));
    std::vector<int64_t> send(size_t(ep), 0), recv(size_t(ep), 0), mine(size_t(El), 0);
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < El; ++e) {
        send[size_t(s)] += counts[size_t(s * El + e)];
        recv[size_t(s)] += rc[size_t(s * El + e)];
        mine[size_t(e)] += rc[size_t(s * El + e)];
      }
    const at::Tensor xr = par->ep_exchange(xs, send, recv, overlapped);  // [sum recv, C] in (source, expert) order
    // Regroup by local expert (source order inside): perm lists the received rows expert by expert.
    std::vector<int64_t> start(size_t(ep * El)), perm;
    perm.reserve(size_t(xr.size(0)));
    int64_t at = 0;
    for (int64_t i = 0; i < ep * El; ++i) start[size_t(i)] = at, at += rc[size_t(i)];
    for (int64_t e = 0; e < El; ++e)
      for (int64_t s = 0; s < ep; ++s)
        for (int64_t r = 0; r < rc[size_t(s * El + e)]; ++r) perm.push_back(start[size_t(s * El + e)] + r);
    const at::Tensor p = at::tensor(perm, at::kLong).to(xr.device());
    const at::Tensor yg = run_experts(xr.index_select(0, p), mine);
    const at::Tensor yr = yg.index_select(0, at::argsort(p, /*stable=*/true, 0));  // back to (source, expert)
    ys = par->ep_exchange(yr, recv, send);
  }
  const at::Tensor wk = w.reshape({-1}).index_select(0, order).unsqueeze(1);  // [N K, 1] fp32
  at::Tensor y = at::zeros_like(xf).index_add(0, token, (ys.to(at::kFloat) * wk).to(xf.scalar_type()));
  route_s_ += std::chrono::duration<double>(Clock::now() - t0 - experts).count();
  return y;
}

at::Tensor MoEImpl::grouped(const at::Tensor& xs, const std::vector<int64_t>& counts, int64_t first) {
  ModelParallel* par = parallel.get();
  const at::Tensor W1 = par ? par->weight(w1) : w1, W2 = par ? par->weight(w2) : w2;
  std::vector<at::Tensor> out;
  int64_t at = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    const at::Tensor seg = xs.narrow(0, at, counts[e]);
    at += counts[e];
    const at::Tensor h = at::relu(linear(seg, W1.select(0, first + int64_t(e)), kernels_)).square();
    out.push_back(linear(h, W2.select(0, first + int64_t(e)), kernels_));
  }
  if (out.empty()) return at::zeros({0, xs.size(1)}, xs.options()) + xs.sum() * 0;  // keeps xs in the graph
  return out.size() == 1 ? out[0] : at::cat(out, 0);
}

}  // namespace dion::train
