// src/train/parallel/ep.cpp — expert parallelism's exchanges (parallel.h, moe.h): the tokens'
// all_to_all to the ranks of their experts, differentiable (backward sends the gradient back
// along the reverse splits), and the exchange of the counts that sizes it.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <chrono>

#include "dion/train/parallel.h"
#include "detail.h"

namespace dion::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using namespace detail;

namespace {

// Forward returns `received` (the all_to_all of x, issued and waited by the caller, so that other
// work can run while it travels); backward sends the gradient back along the reverse splits.
struct EpExchangeFn : torch::autograd::Function<EpExchangeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& received, int64_t seconds,
                            int64_t group, std::vector<int64_t> send, std::vector<int64_t> recv) {
    ctx->saved_data["seconds"] = seconds;
    ctx->saved_data["group"] = group;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    (void)x;
    return received;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::Group& g = from_handle(ctx->saved_data["group"]);
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor back = g.all_to_all_async(grads[0], recv, send).wait();
    *reinterpret_cast<double*>(intptr_t(ctx->saved_data["seconds"].toInt())) +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {back, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Parallel::ep_exchange(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                                 const std::function<void()>& meanwhile) {
  comm::Group* ep = mesh_.group(Axis::ep).get();
  if (!ep || ep->size() == 1) return ModelParallel::ep_exchange(x, send, recv, meanwhile);
  const at::Tensor rows = x.detach().contiguous();  // alive until the wait below
  comm::Work work = ep->all_to_all_async(rows, send, recv);
  if (meanwhile) meanwhile();
  return EpExchangeFn::apply(x, work.wait(), int64_t(reinterpret_cast<intptr_t>(&exchange_backward_s_)),
                             to_handle(ep), send, recv);
}

double Parallel::take_exchange_backward_seconds() {
  const double s = exchange_backward_s_;
  exchange_backward_s_ = 0;
  return s;
}

at::Tensor Parallel::ep_exchange_counts(const at::Tensor& counts) {
  const std::shared_ptr<comm::Group>& ep = mesh_.group(Axis::ep);
  if (!ep || ep->size() == 1) return counts;
  return ep->all_to_all(counts.to(ep->control_device()));
}

}  // namespace dion::train
