// src/train/model/moe.cpp — the mixture-of-experts feed-forward (moe.h).
#include "dion/train/moe.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dion/train/autocast.h"
#include "dion/train/kernels.h"
#include "fused_cpu.h"
#include "router_cpu.h"

namespace dion::train {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Calls f(expert, first_row, rows) for every non-empty block of rows: block i is counts[i] rows
// of expert experts[i], the blocks one after another.
template <class F>
void for_each_group(const std::vector<int64_t>& experts, const std::vector<int64_t>& counts, F&& f) {
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) f(experts[i], at, counts[i]);
    at += counts[i];
  }
}

// The dtype the routed experts compute in, as one node (GroupedExpertsFn, EpExpertsFn):
// autocast's when it is on for xs's device (the operands cast as its linears would cast them), else
// the dtype that xs and both weights share; none when they differ.
std::optional<at::ScalarType> experts_dtype(const at::Tensor& xs, const at::Tensor& W1, const at::Tensor& W2) {
  if (const auto ac = autocast_dtype(xs.device().type())) return ac;
  if (xs.scalar_type() == W1.scalar_type() && W1.scalar_type() == W2.scalar_type()) return W1.scalar_type();
  return std::nullopt;
}

// An expert's product over its block of rows: the block's row count changes every step
// (Shape::varies, dion/train/kernels.h).
at::Tensor expert_mm(const at::Tensor& a, const at::Tensor& b, Kernels kind) {
  return matmul_2d(a, b, kind, Shape::varies);
}
void expert_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, Kernels kind) {
  matmul_2d_out(out, a, b, kind, Shape::varies);
}

// relu^2 and its gradient over one block of rows (contiguous), the fused pass where it applies.
void relu_square_into(const at::Tensor& h, const at::Tensor& act) {
  if (fused_available(h))
    relu_square_out(h, act);
  else
    act.copy_(at::relu(h).square());
}
void relu_square_grad_into(const at::Tensor& h, const at::Tensor& dact, const at::Tensor& da) {
  if (fused_available(h))
    relu_square_grad_out(h, dact, da);
  else
    da.copy_(dact.mul(h.relu()).mul_(2));
}

// The routed experts over blocks of rows, as one autograd node: y = relu(x W1[e]^T)^2 W2[e]^T on
// each block's rows, e its expert. An expert may have several blocks: its weight gradient is the
// sum of its blocks' products (expert parallelism runs EpExpertsFn below instead). Forward and backward write each expert's GEMMs into one
// preallocated buffer per product, and relu and square (and their backward) are one pass over
// all rows. A loop of per-expert linears costs per expert an autograd node each for narrow,
// select, linear, relu, square and linear plus a cat, and narrow's and select's backward each
// fill a zero tensor of the whole input (xs [R, C], the stack [E, H, C]) per expert: 1.5x the
// dense MLP's forward + backward at 8 experts of 1024 rows (C 128, H 170, one Xeon thread,
// 2026-12-06) against 1.0x for this. The products are the same GEMMs on the same operands
// (matmul_2d's kinds), so the values are the loop's.
struct GroupedExpertsFn : torch::autograd::Function<GroupedExpertsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xs, const at::Tensor& W1, const at::Tensor& W2,
                            std::vector<int64_t> experts, std::vector<int64_t> counts, int64_t kind_) {
    const Kernels kind = Kernels(kind_);
    const at::Tensor x = xs.contiguous();
    const int64_t R = x.size(0), H = W1.size(1), C = W2.size(1);
    const at::Tensor h = at::empty({R, H}, x.options()), y = at::empty({R, C}, x.options());
    for_each_group(experts, counts, [&](int64_t e, int64_t at, int64_t n) {
      expert_mm_out(h.narrow(0, at, n), x.narrow(0, at, n), W1.select(0, e).t(), kind);
    });
    // relu^2 in one pass; h stays the pre-activation, which backward reads (fused_cpu.h).
    const at::Tensor act = at::empty_like(h);
    relu_square_into(h, act);
    for_each_group(experts, counts, [&](int64_t e, int64_t at, int64_t n) {
      expert_mm_out(y.narrow(0, at, n), act.narrow(0, at, n), W2.select(0, e).t(), kind);
    });
    ctx->save_for_backward({x, W1, W2, h, act});
    ctx->saved_data["experts"] = experts;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["kind"] = kind_;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &W1 = saved[1], &W2 = saved[2], &h = saved[3], &act = saved[4];
    const std::vector<int64_t> experts = ctx->saved_data["experts"].toIntVector();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const Kernels kind = Kernels(ctx->saved_data["kind"].toInt());
    const at::Tensor dy = grads[0].contiguous();
    const bool want_w1 = ctx->needs_input_grad(1), want_w2 = ctx->needs_input_grad(2);
    const at::Tensor dact = at::empty_like(h);
    const at::Tensor dW1 = want_w1 ? at::zeros_like(W1, at::MemoryFormat::Contiguous) : at::Tensor();
    const at::Tensor dW2 = want_w2 ? at::zeros_like(W2, at::MemoryFormat::Contiguous) : at::Tensor();
    std::vector<bool> seen1(size_t(W1.size(0)), false), seen2(seen1);
    // The first block of an expert writes its weight gradient, later ones add to it.
    auto weight_grad = [&](const at::Tensor& dW, std::vector<bool>& seen, int64_t e, const at::Tensor& a,
                           const at::Tensor& b) {
      if (!seen[size_t(e)]) {
        expert_mm_out(dW.select(0, e), a, b, kind);
        seen[size_t(e)] = true;
      } else {
        dW.select(0, e).add_(expert_mm(a, b, kind));
      }
    };
    for_each_group(experts, counts, [&](int64_t e, int64_t at, int64_t n) {
      const at::Tensor g = dy.narrow(0, at, n);
      expert_mm_out(dact.narrow(0, at, n), g, W2.select(0, e), kind);
      if (want_w2) weight_grad(dW2, seen2, e, g.t(), act.narrow(0, at, n));
    });
    // d/dh relu(h)^2 = 2 relu(h) (0 where relu cuts), times the gradient
    const at::Tensor da = at::empty_like(h);
    relu_square_grad_into(h, dact, da);
    const at::Tensor dx = ctx->needs_input_grad(0) ? at::empty_like(x) : at::Tensor();
    for_each_group(experts, counts, [&](int64_t e, int64_t at, int64_t n) {
      const at::Tensor g = da.narrow(0, at, n);
      if (dx.defined()) expert_mm_out(dx.narrow(0, at, n), g, W1.select(0, e), kind);
      if (want_w1) weight_grad(dW1, seen1, e, g.t(), x.narrow(0, at, n));
    });
    return {dx, dW1, dW2, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};


// t's rows but [at, +n): a view when they lie at an end (always at ep 2), else a copy.
at::Tensor rows_without(const at::Tensor& t, int64_t at, int64_t n) {
  const int64_t rest = t.size(0) - at - n;
  if (at == 0) return t.narrow(0, n, rest);
  if (rest == 0) return t.narrow(0, 0, at);
  return at::cat({t.narrow(0, 0, at), t.narrow(0, at + n, rest)});
}
// rows_without's inverse: src's rows into out's rows but [at, +n).
void rows_around(const at::Tensor& out, int64_t at, int64_t n, const at::Tensor& src) {
  const int64_t rest = out.size(0) - at - n;
  if (at > 0) out.narrow(0, 0, at).copy_(src.narrow(0, 0, at));
  if (rest > 0) out.narrow(0, at + n, rest).copy_(src.narrow(0, at, rest));
}

// Expert parallelism's routed experts as one autograd node, exchanges included (moe.h). xs [R, C]:
// this rank's routed rows grouped by expert, the experts of ep rank 0 first, send[j] rows for ep
// rank j; rc[s * El + e]: rows ep rank s sends to local expert e (recv[s] their sum). Forward sends
// the rows to their experts' ranks, runs the local experts on the (source, expert) blocks, and
// sends the results back into xs's order; backward takes the gradients along the same path
// reversed. A rank's own rows (source = this rank) never travel: their products run while the
// exchanges do, split so that every wait has some — forward: x W1^T and relu^2 during the
// dispatch, act W2^T during the combine; backward: dact, relu^2' and both weight products during
// the gradients' way out, dx during their way back. The received rows' dx go back before their
// weight products, which run during that way back (the partner's wait for its dx: 3-4 ms a step
// -> 1, dp 2 x ep 2, Zen 4). A rank that arrives first works instead of idling. Values: the GEMMs
// of GroupedExpertsFn on the same blocks, and each expert's weight gradient summed over its
// blocks in source order (an own product that is not its expert's first waits for its turn), so
// no bit depends on the overlap.
struct EpExpertsFn : torch::autograd::Function<EpExpertsFn> {
  struct Layout {
    std::vector<int64_t> send, recv, rc;  // rows to / from each ep rank; rows per (source, local expert)
    int64_t rank = 0, El = 0;
    int64_t own_at() const { return std::accumulate(send.begin(), send.begin() + rank, int64_t(0)); }  // in xs
    int64_t own_rows() const { return send[size_t(rank)]; }
    // The exchanges' splits: the own block stays.
    std::vector<int64_t> out_send() const { return but_own(send); }
    std::vector<int64_t> out_recv() const { return but_own(recv); }
    std::vector<int64_t> but_own(std::vector<int64_t> v) const {
      v[size_t(rank)] = 0;
      return v;
    }
    // Source s's first row among the received rows (the own block left out).
    int64_t received_at(int64_t s) const {
      int64_t a = 0;
      for (int64_t i = 0; i < s; ++i)
        if (i != rank) a += recv[size_t(i)];
      return a;
    }
    // f(e, first row, n) for source s's non-empty blocks, rows counted from `base`.
    template <class F>
    void blocks(int64_t s, int64_t base, F&& f) const {
      for (int64_t e = 0, a = base; e < El; a += rc[size_t(s * El + e)], ++e)
        if (rc[size_t(s * El + e)] > 0) f(e, a, rc[size_t(s * El + e)]);
    }
    // True when no rank before this one sends rows to local expert e (the own block comes first).
    bool own_first(int64_t e) const {
      for (int64_t s = 0; s < rank; ++s)
        if (rc[size_t(s * El + e)] > 0) return false;
      return true;
    }
  };
  static Layout layout(AutogradContext* ctx) {
    return {ctx->saved_data["send"].toIntVector(), ctx->saved_data["recv"].toIntVector(),
            ctx->saved_data["rc"].toIntVector(), ctx->saved_data["rank"].toInt(), ctx->saved_data["El"].toInt()};
  }
  static ModelParallel& par(AutogradContext* ctx) {
    return *reinterpret_cast<ModelParallel*>(intptr_t(ctx->saved_data["par"].toInt()));
  }
  // Runs f(), an exchange's issue or wait, adding its seconds to the layer's routing time
  // (MoEImpl::route_s_): routing, not the experts' work.
  template <class F>
  static auto timed(AutogradContext* ctx, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = f();
    *reinterpret_cast<double*>(intptr_t(ctx->saved_data["seconds"].toInt())) +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xs, const at::Tensor& W1, const at::Tensor& W2,
                            std::vector<int64_t> send, std::vector<int64_t> recv, std::vector<int64_t> rc,
                            int64_t rank, int64_t par_handle, int64_t seconds_handle, int64_t kind_) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["rc"] = rc;
    ctx->saved_data["rank"] = rank;
    ctx->saved_data["El"] = W1.size(0);
    ctx->saved_data["par"] = par_handle;
    ctx->saved_data["seconds"] = seconds_handle;
    ctx->saved_data["kind"] = kind_;
    const Layout L = layout(ctx);
    const Kernels kind = Kernels(kind_);
    const at::Tensor x = xs.contiguous();
    const int64_t own_at = L.own_at(), n_own = L.own_rows(), H = W1.size(1), C = W2.size(1);
    const int64_t R = std::accumulate(recv.begin(), recv.end(), int64_t(0)) - n_own;  // rows received
    ModelParallel::Pending out = timed(ctx, [&] {
      return par(ctx).ep_start(rows_without(x, own_at, n_own), L.out_send(), L.out_recv());
    });
    // The own rows' first half while the others' rows travel.
    const at::Tensor h_own = at::empty({n_own, H}, x.options()), act_own = at::empty_like(h_own);
    L.blocks(rank, 0, [&](int64_t e, int64_t a, int64_t n) {
      const at::Tensor hb = h_own.narrow(0, a, n);
      expert_mm_out(hb, x.narrow(0, own_at + a, n), W1.select(0, e).t(), kind);
      relu_square_into(hb, act_own.narrow(0, a, n));
    });
    const at::Tensor xr = timed(ctx, out);  // [R, C]
    const at::Tensor h = at::empty({R, H}, x.options()), act = at::empty_like(h), y = at::empty({R, C}, x.options());
    for (int64_t s = 0; s < int64_t(recv.size()); ++s) {
      if (s == rank) continue;
      L.blocks(s, L.received_at(s), [&](int64_t e, int64_t a, int64_t n) {
        const at::Tensor hb = h.narrow(0, a, n), ab = act.narrow(0, a, n);
        expert_mm_out(hb, xr.narrow(0, a, n), W1.select(0, e).t(), kind);
        relu_square_into(hb, ab);
        expert_mm_out(y.narrow(0, a, n), ab, W2.select(0, e).t(), kind);
      });
    }
    ModelParallel::Pending back = timed(ctx, [&] { return par(ctx).ep_start(y, L.out_recv(), L.out_send()); });
    // The own rows' second half while the results travel back.
    const at::Tensor ys = at::empty({x.size(0), C}, x.options());
    L.blocks(rank, 0, [&](int64_t e, int64_t a, int64_t n) {
      expert_mm_out(ys.narrow(0, own_at + a, n), act_own.narrow(0, a, n), W2.select(0, e).t(), kind);
    });
    rows_around(ys, own_at, n_own, timed(ctx, back));
    ctx->save_for_backward({x, xr, W1, W2, h_own, act_own, h, act});
    return ys;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &xr = saved[1], &W1 = saved[2], &W2 = saved[3];
    const at::Tensor &h_own = saved[4], &act_own = saved[5], &h = saved[6], &act = saved[7];
    const Layout L = layout(ctx);
    const Kernels kind = Kernels(ctx->saved_data["kind"].toInt());
    const bool want_w1 = ctx->needs_input_grad(1), want_w2 = ctx->needs_input_grad(2);
    const int64_t own_at = L.own_at(), n_own = L.own_rows();
    const at::Tensor dys = grads[0].contiguous();  // [sum send, C], xs's order
    const at::Tensor dW1 = want_w1 ? at::zeros_like(W1, at::MemoryFormat::Contiguous) : at::Tensor();
    const at::Tensor dW2 = want_w2 ? at::zeros_like(W2, at::MemoryFormat::Contiguous) : at::Tensor();
    // An expert's first block (in source order) writes its weight gradients, later ones add.
    std::vector<bool> seen(size_t(L.El), false);
    auto weight_products = [&](int64_t e, const at::Tensor& dy, const at::Tensor& a, const at::Tensor& da,
                               const at::Tensor& xb) {
      if (!seen[size_t(e)]) {  // written in place
        if (want_w2) expert_mm_out(dW2.select(0, e), dy.t(), a, kind);
        if (want_w1) expert_mm_out(dW1.select(0, e), da.t(), xb, kind);
        seen[size_t(e)] = true;
      } else {
        if (want_w2) dW2.select(0, e).add_(expert_mm(dy.t(), a, kind));
        if (want_w1) dW1.select(0, e).add_(expert_mm(da.t(), xb, kind));
      }
    };
    ModelParallel::Pending out = timed(ctx, [&] {
      return par(ctx).ep_start(rows_without(dys, own_at, n_own), L.out_send(), L.out_recv());
    });
    // The own rows while the others' gradients travel: dact, relu^2' and the weight products
    // (kept for their turn when an earlier rank sends the expert rows too).
    const at::Tensor da_own = at::empty_like(h_own);
    std::vector<at::Tensor> own1(size_t(L.El)), own2(size_t(L.El));
    L.blocks(L.rank, 0, [&](int64_t e, int64_t a, int64_t n) {
      const at::Tensor g = dys.narrow(0, own_at + a, n), dab = da_own.narrow(0, a, n);
      const at::Tensor dact = expert_mm(g, W2.select(0, e), kind);
      relu_square_grad_into(h_own.narrow(0, a, n), dact, dab);
      const at::Tensor ab = act_own.narrow(0, a, n), xb = x.narrow(0, own_at + a, n);
      if (L.own_first(e)) {
        weight_products(e, g, ab, dab, xb);
      } else {
        if (want_w2) own2[size_t(e)] = expert_mm(g.t(), ab, kind);
        if (want_w1) own1[size_t(e)] = expert_mm(dab.t(), xb, kind);
      }
    });
    const at::Tensor dyr = timed(ctx, out);  // [R, C]
    // The received rows' dx first, so that they start back as early as possible.
    const at::Tensor dxr = at::empty_like(xr), da = at::empty_like(h);
    for (int64_t s = 0; s < int64_t(L.recv.size()); ++s) {
      if (s == L.rank) continue;
      L.blocks(s, L.received_at(s), [&](int64_t e, int64_t a, int64_t n) {
        const at::Tensor dab = da.narrow(0, a, n);
        relu_square_grad_into(h.narrow(0, a, n), expert_mm(dyr.narrow(0, a, n), W2.select(0, e), kind), dab);
        expert_mm_out(dxr.narrow(0, a, n), dab, W1.select(0, e), kind);
      });
    }
    ModelParallel::Pending back = timed(ctx, [&] { return par(ctx).ep_start(dxr, L.out_recv(), L.out_send()); });
    // While they travel: the received rows' weight products, summed in source order with the kept
    // own ones, and the own rows' dx.
    for (int64_t s = 0; s < int64_t(L.recv.size()); ++s) {
      if (s == L.rank) {  // the kept own products, at their turn
        for (int64_t e = 0; e < L.El; ++e) {
          if (want_w2 && own2[size_t(e)].defined()) dW2.select(0, e).add_(own2[size_t(e)]);
          if (want_w1 && own1[size_t(e)].defined()) dW1.select(0, e).add_(own1[size_t(e)]);
        }
        continue;
      }
      L.blocks(s, L.received_at(s), [&](int64_t e, int64_t a, int64_t n) {
        weight_products(e, dyr.narrow(0, a, n), act.narrow(0, a, n), da.narrow(0, a, n), xr.narrow(0, a, n));
      });
    }
    const at::Tensor dxs = at::empty_like(x);
    L.blocks(L.rank, 0, [&](int64_t e, int64_t a, int64_t n) {
      expert_mm_out(dxs.narrow(0, own_at + a, n), da_own.narrow(0, a, n), W1.select(0, e), kind);
    });
    rows_around(dxs, own_at, n_own, timed(ctx, back));
    return {dxs, dW1, dW2, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

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
  at::Tensor scores, sel, w;  // [N, E] scores, [N, K] expert ids and their renormalised weights
  if (kernels_ == Kernels::fast && router_fused_available(logits, K)) {
    Routing r = route_topk_fused(logits, expert_bias, K, cfg_.sigmoid);  // one pass a token (router_cpu.h)
    scores = r.scores, sel = r.sel, w = r.w;
  } else {
    scores = cfg_.sigmoid ? logits.sigmoid() : logits.softmax(-1);
    {
      at::NoGradGuard no_grad;
      sel = std::get<1>(at::topk(scores.detach() + expert_bias, K, -1, /*largest=*/true, /*sorted=*/true));
    }
    w = scores.gather(1, sel);
    w = w / w.sum(-1, /*keepdim=*/true);  // renormalised over the chosen experts
  }
  const auto t_group = std::chrono::steady_clock::now();
  const Grouping groups = group_by_expert(sel, E);  // the routed rows by expert: dispatch's first part
  route_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_group).count();
  if (is_training()) {  // the step's load (validation's forwards do not count)
    const at::Tensor counts = at::tensor(groups.counts, at::kLong);
    load_ = load_.defined() ? load_ + counts : counts;
  }
  aux_loss_ = at::Tensor();
  if (is_training() && cfg_.aux_loss_coef > 0) {
    // DeepSeek-V3's sequence-wise balance loss: per sequence, sum_i f_i P_i.
    const at::Tensor probs = cfg_.sigmoid ? scores / scores.sum(-1, true) : scores;
    const at::Tensor P = probs.view({B, T, E}).mean(1);  // [B, E]
    at::Tensor f = at::zeros({B, E}, scores.options());
    f = f.scatter_add(1, sel.view({B, T * K}), at::ones({B, T * K}, scores.options())) * (double(E) / double(K * T));
    aux_loss_ = (f * P).sum(1).mean() * cfg_.aux_loss_coef;
  }
  // The shared experts compute while the routed tokens travel (expert parallelism); their output
  // is added in the combine.
  return routed(xf, groups, w, [&] { return shared ? shared(x) : at::Tensor(); }).view({B, T, C});
}

at::Tensor MoEImpl::routed(const at::Tensor& xf, const Grouping& groups, const at::Tensor& w,
                           const std::function<at::Tensor()>& meanwhile) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Clock::duration expert_time{0};  // the grouped GEMMs: not routing
  auto run_experts = [&](const at::Tensor& rows, const std::vector<int64_t>& experts,
                         const std::vector<int64_t>& counts) {
    const auto t = Clock::now();
    at::Tensor y = grouped(rows, experts, counts);
    expert_time += Clock::now() - t;
    return y;
  };
  at::Tensor plus;           // meanwhile's output [B, T, C], added to the combined rows
  auto overlapped = [&] {  // not routing either
    const auto t = Clock::now();
    plus = meanwhile();
    expert_time += Clock::now() - t;
  };
  const int64_t E = cfg_.n_experts;
  const at::Tensor &order = groups.order, &token = groups.token;  // [N K]: by expert, token order inside
  const std::vector<int64_t>& counts = groups.counts;              // rows per expert
  // One pass each way for fp32 rows in the fast kind (fused_cpu.h), else ATen's index_select.
  const bool fused_rows = kernels_ == Kernels::fast && rows_fused_available(xf);
  const at::Tensor xs = fused_rows ? gather_rows_fused(xf, token) : xf.index_select(0, token);  // [N K, C]
  ModelParallel* par = parallel.get();
  const int64_t ep = par ? par->ep_size() : 1;
  at::Tensor ys;
  if (ep == 1) {
    overlapped();
    std::vector<int64_t> experts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) experts[size_t(e)] = e;
    ys = run_experts(xs, experts, counts);
  } else {
    // Counts first: rc[s * El + e] = rows rank s sends to my local expert e. The shared experts
    // compute while they travel, and this rank's own rows while the others' do (EpExpertsFn).
    const int64_t El = E / ep, rank = par->ep_rank();
    ModelParallel::Pending counts_in = par->ep_start_counts(at::tensor(counts, at::kLong));
    overlapped();
    const std::vector<int64_t> rc = to_vector(counts_in());
    std::vector<int64_t> send(size_t(ep), 0), recv(size_t(ep), 0);
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < El; ++e) {
        send[size_t(s)] += counts[size_t(s * El + e)];
        recv[size_t(s)] += rc[size_t(s * El + e)];
      }
    // Mixed dtypes without autocast compute in the weights'.
    const at::Tensor W1 = par->weight(w1), W2 = par->weight(w2);
    const at::ScalarType dt = experts_dtype(xs, W1, W2).value_or(W1.scalar_type());
    const auto te = Clock::now();
    ys = EpExpertsFn::apply(xs.to(dt), W1.to(dt), W2.to(dt), send, recv, rc, rank,
                            int64_t(reinterpret_cast<intptr_t>(par)), int64_t(reinterpret_cast<intptr_t>(&route_s_)),
                            int64_t(kernels_));
    // The node adds its exchanges' seconds to route_s_ itself (forward and backward); the rest of
    // its time is the experts'. The counts' wait above is routing.
    expert_time += Clock::now() - te;
  }
  const at::Tensor wk = w.reshape({-1}).index_select(0, order);  // [N K] fp32
  // fp32 rows whose experts computed in bf16 (autocast): their results and the shared experts' in
  // fp32 into the fused combine, which sums in fp32 as ATen's composition below does.
  if (fused_rows && ys.scalar_type() != at::kFloat) ys = ys.to(at::kFloat);
  if (fused_rows && plus.defined() && plus.scalar_type() != at::kFloat) plus = plus.to(at::kFloat);
  const bool fused_combine = fused_rows && rows_fused_available(ys);
  const bool plus_in_combine = fused_combine && plus.defined() && rows_fused_available(plus);
  at::Tensor y = fused_combine
                     ? weighted_scatter_rows_fused(ys, wk, token, xf.size(0), plus_in_combine ? plus : at::Tensor())
                     : at::zeros_like(xf).index_add(0, token, (ys.to(at::kFloat) * wk.unsqueeze(1)).to(xf.scalar_type()));
  if (plus.defined() && !plus_in_combine) y = y + plus.view_as(y);
  route_s_ += std::chrono::duration<double>(Clock::now() - t0 - expert_time).count();
  return y;
}

at::Tensor MoEImpl::grouped(const at::Tensor& xs, const std::vector<int64_t>& experts,
                            const std::vector<int64_t>& counts) {
  ModelParallel* par = parallel.get();
  const at::Tensor W1 = par ? par->weight(w1) : w1, W2 = par ? par->weight(w2) : w2;
  // Mixed dtypes without autocast: the loop of linears below.
  if (const auto dt = experts_dtype(xs, W1, W2))
    return GroupedExpertsFn::apply(xs.to(*dt), W1.to(*dt), W2.to(*dt), experts, counts, int64_t(kernels_));
  std::vector<at::Tensor> out;
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    const at::Tensor seg = xs.narrow(0, at, counts[i]);
    at += counts[i];
    const at::Tensor h = at::relu(linear(seg, W1.select(0, experts[i]), kernels_)).square();
    out.push_back(linear(h, W2.select(0, experts[i]), kernels_));
  }
  if (out.empty()) return at::zeros({0, xs.size(1)}, xs.options()) + xs.sum() * 0;  // keeps xs in the graph
  return out.size() == 1 ? out[0] : at::cat(out, 0);
}

}  // namespace dion::train
