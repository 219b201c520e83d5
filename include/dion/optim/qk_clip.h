// dion/optim/qk_clip.h — QK-clip over any layout: the ranks' largest attention logits combined in
// one collective, then each rank scales its own part of every layer's query and key weights.
//
// API summary
//   std::vector<dion::QkClipLayer> layers;
//   layers.push_back({"block0.attn", wq, wk, {}, {}, /*n_heads=*/8, /*n_kv_heads=*/8, /*head_dim=*/64});
//   dion::QkClip clip(/*tau=*/100.0, layers, group);   // group: every rank that computes logits; null: one process
//   opt.step();
//   at::Tensor S = clip.apply(max_logits);  // max_logits[l]: this rank's [n_heads] maxima (-inf: not computed here)
//
// The math is dion/math/qk_clip.h. Here: the maxima of all layers packed into one [L * H] float32
// vector, one all_gather over `group` and the max over the ranks (each rank then holds the same
// global S), and per layer the scaling of this rank's rows. Data parallel ranks see other
// sequences, tensor parallel ranks other heads, context parallel ranks other positions: the max
// over all of them is the whole batch's, whatever the layout. A weight sharded on its rows (FSDP,
// TP on the heads) names the global row of each local row (`wq_rows`, int64; a strided shard's
// rows interleave); one sharded on its columns holds every row (leave `wq_rows` undefined).
//
// Errors (dion::ValueError, naming the layer): tau not finite and > 0; heads not dividing; a
// weight that is not 2-D or whose rows are out of the heads' range; a maxima vector of the wrong
// length; a NaN or +inf global maximum (the forward diverged: nothing is scaled, on every rank).
// Every check that needs no collective comes before the collective, so a bad call throws on every
// rank alike; the NaN check follows the gather, where every rank sees the same values.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dion/optim/distribution.h"

namespace dion {

struct QkClipLayer {
  std::string name;              // in messages: "block0.attn"
  at::Tensor wq, wk;             // this rank's part of the query / key projection weights (scaled in place)
  at::Tensor wq_rows, wk_rows;   // the global row of each local row (int64); undefined: all rows, in order
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
};

class QkClip {
 public:
  QkClip(double tau, std::vector<QkClipLayer> layers, std::shared_ptr<AxisGroup> group = nullptr);

  // Combines this rank's maxima with the others' (one collective), scales the weights of every
  // head above tau, returns the global maxima [layers, n_heads max] (float32, -inf padded).
  at::Tensor apply(const std::vector<at::Tensor>& max_logits);

  double tau() const { return tau_; }
  const std::vector<QkClipLayer>& layers() const { return layers_; }

 private:
  double tau_;
  std::vector<QkClipLayer> layers_;
  std::shared_ptr<AxisGroup> group_;
  int64_t width_ = 0;  // the most heads of any layer: the packed row length
};

}  // namespace dion
