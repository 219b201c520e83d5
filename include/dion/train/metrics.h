// dion/train/metrics.h — RUN_DIR/metrics.jsonl: one JSON object per training step and per
// validation, the file `dion-train plot` (tools/dion-train/plot.py) reads.
//
//   {"kind":"train","step":N,"loss":L,"grad_norm":G,"lr":LR,"tokens":T,"tokens_per_s":R,"ms_per_step":M,"time_s":S}
//   (a skipped non-finite step adds "skipped":true; a NaN or inf value is written as null)
//   {"kind":"val","step":N,"val_loss":L,"tokens":T,"time_s":S}
// step: the training step (0-based; a val record at step N is taken before step N trains, and
// at N = num_iterations at the end); tokens: training tokens consumed so far; time_s: wall
// seconds of the run so far (across resumed invocations); lr: group 0's learning rate;
// grad_norm: the global gradient norm before clipping (dion/train/grad_norm.h).
//
// On resume the file keeps only the records with step <= the checkpoint's step, so that the
// resumed file is the one an uninterrupted run writes. Every line is flushed when written.
//
// What it is not: TensorBoard (a separate writer), or the console lines (train.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace dion::train {

class MetricsWriter {
 public:
  // keep_through_step < 0: start a new file; else keep records with step <= it.
  MetricsWriter(const std::filesystem::path& file, int64_t keep_through_step);
  // fwd_bwd_ms: the forward and backward passes' part of ms_per_step (the rest: the optimizer step).
  void train(int64_t step, double loss, double grad_norm, double lr, int64_t tokens, double tokens_per_s,
             double ms_per_step, double time_s, double fwd_bwd_ms, bool skipped = false,
             const std::vector<double>& moe_imbalance = {},  // MoE: max / mean tokens per expert, per layer
             double moe_route_ms = -1);  // MoE: dispatch + combine time of the step (GPT::take_route_seconds)
  void val(int64_t step, double val_loss, int64_t tokens, double time_s);

 private:
  std::ofstream out_;
};

}  // namespace dion::train
