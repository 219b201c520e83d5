// dion/train/mesh_shape.h — the sizes of a training run's device mesh (dp, fs, tp) and of its
// expert-parallel axis: what the config checks and the parallel layout (parallel.h) share. No
// tensors, no groups.
#pragma once

#include <cstdint>

namespace dion::train {

// ep: expert parallelism borrows ranks from the data-parallel ones (it divides dp x fs; the tp ranks
// of a data rank each run its MoE whole, tp_dim -1 for the experts and routers):
// the data ranks d = b * ep + e form ep groups of consecutive ranks (the b-th), and rank e of each
// holds the experts [e * E / ep, +E / ep) of every MoE stack; the ranks holding the same experts
// (same e) form the "edp" group over which the experts' gradients are summed. The dense part keeps
// its (dp, fs) layout.
// EP x FSDP: when ep divides fs (ep groups inside one dp replica), each ep rank's experts are
// further split over the efs = fs / ep ranks that hold the same experts in that replica (fs rank
// f = b * ep + e: rank e of the b-th ep group), so that dim 0 of a stack is split over ep x efs =
// fs ranks: whole experts on every rank (n_experts must be a multiple of fs), gathered over efs
// for compute as FSDP gathers a weight, gradients reduce-scattered back over efs, then summed
// over "edp" = the dp replicas of that shard. Otherwise (ep does not divide fs) the experts are
// whole on each ep rank and replicated over edp (the data ranks / ep holding the same experts).
struct MeshShape {
  int64_t dp = 1, fs = 1, tp = 1, ep = 1;
  int64_t world() const { return dp * fs * tp; }
  // The ranks each ep rank's experts are split over (EP x FSDP), 1 when they are not.
  int64_t efs() const { return ep > 1 && fs > ep && fs % ep == 0 ? fs / ep : 1; }
};

}  // namespace dion::train
