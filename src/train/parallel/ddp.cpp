// src/train/parallel/ddp.cpp — GradSync (ddp.h): DDP's gradient all-reduce over dp in buckets,
// launched from post-accumulate-grad hooks in bucket order and waited before the step.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

#include "dion/train/ddp.h"

namespace dion::train {

namespace {
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradSync* s, size_t i) : sync(s), index(i) {}
  void operator()(const torch::autograd::Variable&) override { sync->ready(index); }
  GradSync* sync;
  size_t index;
};
}  // namespace

GradSync::GradSync(std::shared_ptr<comm::Group> group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(std::move(group)), params_(std::move(params)) {
  // Buckets in reverse registration order: backward produces the last layers' gradients first.
  bucket_of_.assign(params_.size(), 0);
  int64_t fill = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t bytes = params_[k].numel() * int64_t(params_[k].element_size());
    if (buckets_.empty() || (fill > 0 && fill + bytes > bucket_bytes)) {
      buckets_.emplace_back();
      fill = 0;
    }
    buckets_.back().members.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    fill += bytes;
  }
  for (size_t k = 0; k < params_.size(); ++k)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k], std::make_unique<ReadyHook>(this, k));
}

GradSync::~GradSync() {
  for (at::Tensor& p : params_) torch::autograd::impl::post_acc_grad_hooks(p).reset();
}

void GradSync::arm() {
  armed_ = true;
  next_launch_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = b.members.size();
    b.launched = false;
    b.work = comm::Work();
  }
}

void GradSync::ready(size_t index) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[index]];
  if (b.pending > 0) --b.pending;
  launch_ready_prefix();
}

void GradSync::launch_ready_prefix() {
  // Strictly in bucket order, so that every rank issues the same all_reduces in the same order
  // whatever order its hooks fire in.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(buckets_[next_launch_++]);
}

void GradSync::launch(Bucket& b) {
  std::vector<at::Tensor> grads;
  for (size_t k : b.members) {
    const at::Tensor& g = params_[k].grad();
    grads.push_back(g.defined() ? g.reshape({-1}) : at::zeros({params_[k].numel()}, params_[k].options()));
  }
  b.flat = at::cat(grads);  // [sum of numels]
  b.work = group_->all_reduce_async(b.flat);
  b.launched = true;
}

void GradSync::finish() {
  if (!armed_) throw std::logic_error("GradSync::finish without arm()");
  launched_in_backward_ = int64_t(next_launch_);
  for (Bucket& b : buckets_) b.pending = 0;  // parameters without a gradient this step: zeros
  launch_ready_prefix();
  at::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    at::Tensor flat = b.work.wait();
    int64_t off = 0;
    for (size_t k : b.members) {
      at::Tensor& p = params_[k];
      const int64_t n = p.numel();
      at::Tensor sum = flat.narrow(0, off, n).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(sum);
      else
        p.mutable_grad() = sum.clone();
      off += n;
    }
    b.flat = at::Tensor();
  }
  armed_ = false;
}

}  // namespace dion::train
