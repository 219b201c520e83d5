// src/train/parallel/ep.cpp — expert parallelism's exchanges (parallel.h, moe.h): the tokens'
// all_to_all to the ranks of their experts, differentiable (backward sends the gradient back
// along the reverse splits), and the exchange of the counts that sizes it.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <chrono>

#include "detail.h"

namespace dion::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using namespace detail;

namespace {

// Forward returns `received` (the all_to_all of x, issued and waited by the caller, so that other
// work can run while it travels); backward sends the gradient back along the reverse splits.
struct EpExchangeFn : torch::autograd::Function<EpExchangeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& received, int64_t parallel,
                            int64_t group, std::vector<int64_t> send, std::vector<int64_t> recv) {
    ctx->saved_data["parallel"] = parallel;
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
    parallel_of(ctx->saved_data["parallel"])
        .count_exchange_backward(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return {back, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Parallel::ep_exchange(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                                 const std::function<void()>& meanwhile) {
  if (!ep_ || ep_->size() == 1) return ModelParallel::ep_exchange(x, send, recv, meanwhile);
  const at::Tensor rows = x.detach().contiguous();  // alive until the wait below
  comm::Work work = ep_->all_to_all_async(rows, send, recv);
  if (meanwhile) meanwhile();
  return EpExchangeFn::apply(x, work.wait(), int64_t(reinterpret_cast<intptr_t>(this)), to_handle(ep_.get()), send,
                             recv);
}

double Parallel::take_exchange_backward_seconds() {
  const double s = exchange_backward_s_;
  exchange_backward_s_ = 0;
  return s;
}

at::Tensor Parallel::ep_exchange_counts(const at::Tensor& counts) {
  if (!ep_ || ep_->size() == 1) return counts;
  return ep_->all_to_all(counts.to(ep_->control_device()));
}

}  // namespace dion::train
