// dion-train's micro-batch forward + backward and optimizer step, eager or captured in CUDA
// graphs (see include/dion/train/graphed_step.h). The CUDA pieces compile with DION_HAVE_CUDA.
#include "dion/train/graphed_step.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <optional>

#include "dion/errors.h"
#include "dion/optim/cuda_graph.h"
#include "dion/train/autocast.h"
#include "dion/train/config.h"

#ifdef DION_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dion::train {

struct MicroStep::Impl {
  GPT& model;
  dion::Optimizer& opt;
  at::Device device;
  bool autocast;
  double loss_scale;
  bool graphs;
  int64_t steps_done = 0;  // optimizer steps
  int64_t replays = 0;
  std::unique_ptr<CudaGraphStep> graphed_opt;
  at::Tensor x_static, y_static, loss_static;  // the captured micro-batch's inputs and loss
#ifdef DION_HAVE_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> stream;  // the run's side stream (capture needs one)
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  Impl(GPT& m, dion::Optimizer& o, const at::Device& d, bool ac, double s, bool g)
      : model(m), opt(o), device(d), autocast(ac), loss_scale(s), graphs(g) {}

  at::Tensor eager(const at::Tensor& x, const at::Tensor& y) const {
    at::Tensor loss;
    {
      AutocastScope ac(device.type(), autocast);
      loss = model->loss(x.to(device), y.to(device));
    }
    (loss * loss_scale).backward();
    return loss.detach();
  }
};

MicroStep::MicroStep(GPT& model, dion::Optimizer& opt, const at::Device& device, bool autocast, double loss_scale,
                     bool graphs)
    : impl_(std::make_unique<Impl>(model, opt, device, autocast, loss_scale, graphs)) {
  if (!graphs) return;
  if (!device.is_cuda())
    throw ConfigError("key 'cuda_graphs': true needs device cuda (the run's device is " + device.str() + ")");
#ifdef DION_HAVE_CUDA
  c10::cuda::device_synchronize();  // the model and the optimizer's state were set up on the default stream
  impl_->stream.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()));
  impl_->graphed_opt = std::make_unique<CudaGraphStep>(opt, /*warmup_steps=*/1);
#else
  throw ConfigError("key 'cuda_graphs': this dion-train was built without CUDA (torch without CUDA or no nvcc)");
#endif
}

MicroStep::~MicroStep() {
#ifdef DION_HAVE_CUDA
  if (impl_->stream) {
    try {
      impl_->stream->current_stream().synchronize();  // before the default stream is current again
    } catch (...) {
    }
  }
#endif
}

bool MicroStep::graphs() const { return impl_->graphs; }
bool MicroStep::captured() const { return impl_->loss_static.defined(); }
int64_t MicroStep::replays() const { return impl_->replays; }

at::Tensor MicroStep::forward_backward(const at::Tensor& x, const at::Tensor& y) {
  Impl& s = *impl_;
  if (!s.graphs || s.steps_done < 1) return s.eager(x, y);  // the warm-up step
#ifdef DION_HAVE_CUDA
  if (!s.graph) {
    for (const at::Tensor& p : s.model->parameters())
      if (p.requires_grad() && !p.grad().defined())
        throw ValueError(
            fmt::format("cuda_graphs: a parameter of shape {} has no gradient after the warm-up step; "
                        "the captured backward would never write it",
                        c10::str(p.sizes())));
    s.x_static = x.to(s.device).clone();
    s.y_static = y.to(s.device).clone();
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    graph->capture_begin();
    try {
      s.loss_static = s.eager(s.x_static, s.y_static);
    } catch (const std::exception& e) {
      try {
        graph->capture_end();
      } catch (...) {
      }
      s.loss_static = at::Tensor();
      throw ValueError(std::string("cuda_graphs: the forward + backward of a micro-batch could not be captured in a "
                                   "CUDA graph: ") +
                       e.what());
    }
    graph->capture_end();
    s.graph = std::move(graph);
    s.graph->replay();  // the capture ran nothing: this micro-batch
    s.replays = 1;
    return s.loss_static;
  }
  TORCH_CHECK(x.sizes() == s.x_static.sizes() && y.sizes() == s.y_static.sizes(), "cuda_graphs: micro-batch shape ",
              x.sizes(), " differs from the captured ", s.x_static.sizes(), " (the shapes of a graph are fixed)");
  s.x_static.copy_(x);
  s.y_static.copy_(y);
  s.graph->replay();
  ++s.replays;
  return s.loss_static;
#else
  return s.eager(x, y);
#endif
}

void MicroStep::optimizer_step() {
  Impl& s = *impl_;
  if (s.graphed_opt) {
    s.graphed_opt->step();
    s.opt.zero_grad(/*set_to_none=*/false);  // the graphs hold the .grad tensors
  } else {
    s.opt.step();
    s.opt.zero_grad(/*set_to_none=*/true);
  }
  ++s.steps_done;
}

void MicroStep::discard_gradients() {
  Impl& s = *impl_;
  // What optimizer_step does to the gradients, without the step: the weights, the optimizer's
  // state and step counters stay as they are (a skipped non-finite step, train.cpp).
  s.opt.zero_grad(/*set_to_none=*/!s.graphed_opt);
}

}  // namespace dion::train
