// dion/train/train.h — one training run of dion-train, one process (CPU or one CUDA device).
//
// train_run(config) does, in order (train.py main() for one process):
//   1. check the data (every shard's header; debug mode: synthetic tokens) and the checkpoint
//      folder, before anything is written;
//   2. build the GPT (seeded init), the optimizer (optim_setup.h), resume from the newest
//      checkpoint in checkpoint_dir when there is one (and resume is true);
//   3. write RUN_DIR/config.yaml, open RUN_DIR/metrics.jsonl;
//   4. loop: validation every val_loss_every steps (and at the end), then
//      grad_accum_steps x (forward + backward) per step, the global gradient norm (and clipping,
//      grad_clip), optimizer step at the scheduled lr — or, when the loss or the gradient is not
//      finite, the step skipped (max_nonfinite_steps in a row, then NonFiniteError) —
//      one console line per step, a checkpoint every checkpoint_freq steps and at the end;
//   5. print a summary.
// Throws ConfigError (exit 2), DataLoadError / CheckpointError / NonFiniteError (exit 1).
// train_run is Trainer(config).run() (dion/train/trainer.h: each part above is a member
// function there: setup, evaluate, step, save, the report_* ones).
#pragma once

#include <stdexcept>
#include <string>

#include "dion/train/config.h"

namespace dion::train {

// "cpu" or "cuda": where a run trains (config.device, with "auto" resolved: cuda when this
// process sees a CUDA device, else cpu).
std::string resolve_device(const Config& config);
// "fp32" or "bf16": the dtype a run computes in (config.dtype, with "auto" resolved:
// cuda_auto_dtype on CUDA, kCpuAutoDtype on CPU; device auto resolved first).
std::string resolve_dtype(const Config& config);
// dtype auto on a GPU of compute capability `major`.x: bf16 autocast from 8 (Ampere: bf16 tensor
// cores), fp32 below (a T4 (7.5) or V100 has no bf16 hardware: ATen emulates bf16 GEMMs there,
// slower than fp32); -1 (unknown): bf16.
std::string cuda_auto_dtype(int major);
// The CPU default for dtype auto, chosen by measurement (docs/train.md "CPU dtype").
inline constexpr const char* kCpuAutoDtype = "fp32";

struct RunSummary {
  int64_t steps_done = 0;  // in this invocation
  int64_t last_step = -1;
  double best_val_loss = 0;
  int64_t best_val_step = -1;
  bool stopped_early = false;  // stop_after
  int64_t steps_skipped = 0;   // non-finite steps skipped in this invocation
};

// More than max_nonfinite_steps non-finite steps in a row: the run diverged. Exit code 1.
class NonFiniteError : public std::runtime_error {
 public:
  explicit NonFiniteError(const std::string& message) : std::runtime_error(message) {}
};

RunSummary train_run(const Config& config);

}  // namespace dion::train
