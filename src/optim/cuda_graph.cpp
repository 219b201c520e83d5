// The CUDA-graph step wrapper (see include/dion/optim/cuda_graph.h): warm-up, capture on a side
// stream, replay; and the snapshot that refuses a replay the graph cannot do correctly. Uses the
// Optimizer's public API only; the CUDA pieces compile only with DION_HAVE_CUDA.
#include "dion/optim/cuda_graph.h"

#include <ATen/ATen.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dion/errors.h"
#include "dion/optim/optimizer.h"
#include "dion/optim/options.h"

#ifdef DION_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dion {

namespace {

std::string where(size_t g, size_t i, const at::Tensor& p) {
  std::ostringstream os;
  os << "param group " << g << ", parameter " << i << " of shape " << p.sizes();
  return os.str();
}

}  // namespace

// What the graph was captured with; a replay checks that nothing of it changed.
struct Snapshot {
  std::vector<const c10::TensorImpl*> params;
  std::vector<const void*> grads;               // data pointers of the gradients
  std::vector<std::optional<Options>> options;  // per group (dion::Options), else only lr
  std::vector<double> lrs;
  std::vector<const void*> states;  // the state entries, per parameter
};

struct CudaGraphStep::Impl {
  torch::optim::Optimizer& opt;
  dion::Optimizer* dion_opt = nullptr;  // set when opt is one: lr / weight decay read on the device
  int warmup_steps;
  int eager_steps = 0;
  int64_t replays = 0;
  Snapshot snap;
  bool captured = false;
#ifdef DION_HAVE_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  c10::DeviceIndex device = 0;

  Impl(torch::optim::Optimizer& o, int w) : opt(o), dion_opt(dynamic_cast<dion::Optimizer*>(&o)), warmup_steps(w) {}

  // The lr / weight decay tensors the graph reads, filled from the groups' values (outside any
  // capture: before an eager step, the capture and every replay).
  void refresh() {
    if (dion_opt) dion_opt->refresh_device_scalars();
  }

  const void* state_of(const at::Tensor& p) const {
    auto it = opt.state().find(p.unsafeGetTensorImpl());
    return it == opt.state().end() ? nullptr : static_cast<const void*>(it->second.get());
  }

  Snapshot take(bool require_grads) const {
    Snapshot s;
    const auto& groups = opt.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto* o = dynamic_cast<const Options*>(&groups[g].options());
      s.options.push_back(o ? std::optional<Options>(*o) : std::nullopt);
      s.lrs.push_back(groups[g].options().get_lr());
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& p = params[i];
        if (require_grads && !p.grad().defined())
          throw ValueError(where(g, i, p) +
                           " has no gradient: a captured step would never update it (or would read a gradient "
                           "tensor that does not exist yet); run backward before the first graphed step, or leave "
                           "the parameter out of the optimizer");
        s.params.push_back(p.unsafeGetTensorImpl());
        s.grads.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
        s.states.push_back(state_of(p));
      }
    }
    return s;
  }

  // Throws ValueError naming what changed since the capture.
  void check_unchanged() const {
    const Snapshot now = take(false);
    const std::string redo = "; call reset() to capture the step again";
    if (now.params != snap.params)
      throw ValueError("the optimizer's parameter set changed since the step was captured (" +
                       std::to_string(snap.params.size()) + " parameters then, " + std::to_string(now.params.size()) +
                       " now, or other tensors)" + redo);
    for (size_t k = 0; k < now.grads.size(); ++k)
      if (now.grads[k] != snap.grads[k])
        throw ValueError("parameter " + std::to_string(k) + "'s gradient is not the tensor the step was captured with" +
                         (now.grads[k] ? std::string(" (it was replaced)") : std::string(" (it is undefined now)")) +
                         ": write gradients into the same tensors (zero_grad(false), not set_to_none)" + redo);
    if (now.states != snap.states)
      throw ValueError("the optimizer's state was replaced since the step was captured (load_state_dict?)" + redo);
    for (size_t g = 0; g < now.lrs.size(); ++g) {
      // A dion::Optimizer reads lr (and weight decay, but AdamW's) from device tensors: a
      // replay follows a schedule. Any other optimizer reads lr on the host.
      if (now.lrs[g] != snap.lrs[g] && !dion_opt)
        throw ValueError("param group " + std::to_string(g) + ": lr changed from " + std::to_string(snap.lrs[g]) +
                         " to " + std::to_string(now.lrs[g]) +
                         " since the step was captured; this optimizer reads lr on the host, so a replay would use "
                         "the old value" +
                         redo);
      if (now.options[g] && snap.options[g]) {
        Options then = *snap.options[g];
        then.step(now.options[g]->step());  // the counter advances with every step
        if (dion_opt) {
          then.lr(now.options[g]->lr());
          if (then.spec().weight_decay_on_host && then.weight_decay() != now.options[g]->weight_decay())
            throw ValueError("param group " + std::to_string(g) + " (" + then.algorithm() +
                             "): weight_decay changed from " + std::to_string(then.weight_decay()) + " to " +
                             std::to_string(now.options[g]->weight_decay()) +
                             " since the step was captured; this algorithm reads weight decay on the host "
                             "(AlgorithmSpec::weight_decay_on_host), so a replay would use the old value" +
                             redo);
          then.weight_decay(now.options[g]->weight_decay());
        }
        if (!(then == *now.options[g]))
          throw ValueError("param group " + std::to_string(g) +
                           ": a hyperparameter changed since the step was captured; a replay would use the captured "
                           "values" +
                           redo);
      }
    }
  }

  void advance_step_counters() {  // what opt.step() does on the host and a replay cannot
    for (auto& group : opt.param_groups())
      if (auto* o = dynamic_cast<Options*>(&group.options())) o->step(o->step() + 1);
  }
};

CudaGraphStep::CudaGraphStep(torch::optim::Optimizer& optimizer, int warmup_steps)
    : impl_(std::make_unique<Impl>(optimizer, warmup_steps)) {
  if (warmup_steps < 0)
    throw ValueError("CudaGraphStep: warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  if (impl_->dion_opt && impl_->dion_opt->distribution()) {
    // Refused before any capture: a capture that failed on one rank only would leave the others
    // waiting in a collective (and the ranks-agree check reads its results on the host).
    const Distribution& d = *impl_->dion_opt->distribution();
    const int processes = d.axis_size(Axis::OUTER) * d.axis_size(Axis::INNER) * d.axis_size(Axis::REPLICA);
    if (processes > 1)
      throw ValueError("CudaGraphStep: the optimizer is distributed over " + std::to_string(processes) +
                       " processes; its step issues collectives and reads some of their results on the host "
                       "(the ranks-agree check, Dion2's selection), which a capture cannot hold: capture a "
                       "single-process optimizer only");
  }
  std::optional<at::Device> device;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      if (!p.is_cuda())
        throw ValueError(where(g, i, p) + " is on " + p.device().str() +
                         ": a CUDA graph captures CUDA work only; every parameter must be on one CUDA device");
      if (device && *device != p.device())
        throw ValueError(where(g, i, p) + " is on " + p.device().str() + ", others on " + device->str() +
                         ": one graph runs on one device");
      device = p.device();
    }
  if (!device) throw ValueError("CudaGraphStep: the optimizer has no parameters");
  impl_->device = device->index();
#ifndef DION_HAVE_CUDA
  throw NotImplementedError("CudaGraphStep: dion-cpp was built without CUDA (torch without CUDA or no nvcc)");
#endif
  if (impl_->dion_opt) impl_->dion_opt->set_device_scalars(true);
}

CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::captured() const { return impl_->captured; }
int64_t CudaGraphStep::replays() const { return impl_->replays; }

void CudaGraphStep::reset() {
  impl_->captured = false;
  impl_->replays = 0;
#ifdef DION_HAVE_CUDA
  impl_->graph.reset();
#endif
}

void CudaGraphStep::step() {
  Impl& s = *impl_;
  if (!s.captured && s.eager_steps < s.warmup_steps) {
    s.refresh();
    s.opt.step();
    ++s.eager_steps;
    return;
  }
#ifdef DION_HAVE_CUDA
  if (!s.captured) {
    Snapshot before = s.take(/*require_grads=*/true);
    s.refresh();  // the capture records reads of these tensors, never a fill
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(s.device);
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, s.device);
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);  // the side stream sees the gradients the current stream wrote
    {
      c10::cuda::CUDAStreamGuard guard(side);
      graph->capture_begin();
      try {
        s.opt.step();
      } catch (const std::exception& e) {
        try {
          graph->capture_end();
        } catch (...) {
        }
        throw ValueError(std::string("the optimizer step could not be captured in a CUDA graph (does it synchronize "
                                     "with the host, e.g. a .item()?): ") +
                         e.what());
      }
      graph->capture_end();
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
    s.graph = std::move(graph);
    // The capture ran no kernels and did advance the host counters once: replay for this step.
    s.snap = s.take(false);
    (void)before;
    s.captured = true;
    s.graph->replay();
    s.replays = 1;
    return;
  }
  s.check_unchanged();
  s.refresh();  // this step's lr / weight decay, read by the replay
  s.graph->replay();
  s.advance_step_counters();
  s.snap = s.take(false);  // the options' step counters moved; nothing else may have
  ++s.replays;
#else
  throw NotImplementedError("CudaGraphStep: dion-cpp was built without CUDA");
#endif
}

}  // namespace dion
