// src/train/train.cpp — dion-train's entry point (train.h): device and dtype auto resolved, and
// train_run, which runs a Trainer (dion/train/trainer.h: setup, the loop, the report).
#include "dion/train/train.h"

#include <ATen/Context.h>

#include "dion/cuda/fused.h"
#include "dion/train/trainer.h"

namespace dion::train {

std::string resolve_device(const Config& c) {
  if (c.device != "auto") return c.device;
  return at::globalContext().hasCUDA() ? "cuda" : "cpu";
}

std::string resolve_dtype(const Config& c) {
  if (c.dtype != "auto") return c.dtype;
  return resolve_device(c) == "cuda" ? cuda_auto_dtype(cuda::compute_capability_major()) : kCpuAutoDtype;
}

RunSummary train_run(const Config& config) { return Trainer(config).run(); }

}  // namespace dion::train
