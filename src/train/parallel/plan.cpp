// src/train/parallel/plan.cpp — the GPT's parallelization plan, by parameter name: where each
// parameter lives at a mesh shape (Layout::place, layout.h) and the FSDP unit it belongs to.
#include <stdexcept>

#include "detail.h"

namespace dion::train {

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

std::string detail::unit_of(const std::string& name) {
  const std::string pre = "transformer.h.";
  if (name.rfind(pre, 0) != 0) return name;
  return name.substr(0, name.find('.', pre.size()) + 1);
}

// tp: c_q, c_k, c_v, c_fc column-parallel (rows split); c_proj row-parallel (columns split); wte
// and lm_head rows split at rest, gathered over tp for compute. fs: the dim tp does not split
// (dim 0 without tp), as the reference's fully_shard shard_placement_fn.
Placement Layout::place(const std::string& name, const std::vector<int64_t>& global_shape) const {
  const MeshShape& m = shape_;
  Placement p{name, global_shape};
  const bool column = ends_with(name, "attn.c_q.weight") || ends_with(name, "attn.c_k.weight") ||
                      ends_with(name, "attn.c_v.weight") || ends_with(name, "mlp.c_fc.weight") ||
                      ends_with(name, "mlp.shared.c_fc.weight");
  const bool row = ends_with(name, "c_proj.weight");
  const bool vocab = ends_with(name, "wte.weight") || ends_with(name, "lm_head.weight");
  const bool experts = ends_with(name, "mlp.experts.w1") || ends_with(name, "mlp.experts.w2");
  // MoE (moe.h): the expert stacks [E, .., ..] over ep when there is one, else FSDP's dim 0; the
  // router [E, C] FSDP's dim 0. Neither is split over tp: the MoE runs whole on every tp rank of a
  // data rank (its input and output are the replicated residual stream).
  if (experts || ends_with(name, "mlp.router.weight")) {
    if (experts && m.ep > 1) {
      p.ep_dim = 0;
      p.efs = m.efs();
    } else if (m.fs > 1)
      p.fs_dim = 0;
    return p;
  }
  if (!column && !row && !vocab) throw std::logic_error("parallel layout: no placement for parameter '" + name + "'");
  if (m.tp > 1) {
    p.tp_dim = row ? 1 : 0;
    p.tp_gather = vocab;
  }
  if (m.fs > 1) p.fs_dim = m.tp > 1 ? (row ? 0 : 1) : 0;
  return p;
}

}  // namespace dion::train
