// src/train/qk_clip.h — dion-train's QK-clip (key qk_clip_tau): every block's c_q and c_k, this
// rank's parts of them, as the layers of one dion::QkClip over all ranks (dion/optim/qk_clip.h).
//
// Each attention keeps the largest logit of its heads over the step's training forwards
// (GPTConfig::track_max_logits); after the optimizer step, apply() places this rank's maxima at
// its heads (a TP rank holds n_head / tp of them; -inf elsewhere), combines them over every rank
// in one collective (data-parallel ranks saw other sequences, TP ranks other heads) and scales
// the rows of c_q and c_k that this rank holds (the layout's local box: FSDP and TP split the
// rows). Every rank calls apply() once a step, after the step, in the same place.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "dion/optim/qk_clip.h"
#include "dion/train/gpt.h"
#include "dion/train/parallel.h"

namespace dion::train {

class TrainQkClip {
 public:
  TrainQkClip(double tau, GPT model, Parallel& par);
  // After step `step`'s optimizer step: returns the global maxima [n_layer, n_head].
  at::Tensor apply(int64_t step);
  // A skipped step: this step's maxima dropped, nothing scaled, no collective (every rank skips alike).
  void discard();
  // "QK-clip at tau 50: 12 head clips over 100 steps, the largest logit 71.2 (step 3, layer 0 head 5)".
  std::string summary() const;

 private:
  GPT model_;
  Parallel& par_;
  std::unique_ptr<dion::QkClip> clip_;
  std::shared_ptr<dion::AxisGroup> world_;
  int64_t clips_ = 0, steps_ = 0, largest_step_ = -1, largest_layer_ = 0, largest_head_ = 0;
  double largest_ = -INFINITY;
};

}  // namespace dion::train
