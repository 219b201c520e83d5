// src/train/model/parallel_plan.cpp — the GPT's parallelization plan, keyed by parameter name:
// where each parameter lives at a layout (placement_of), this rank's part of it (local_part,
// local_box), and the FSDP unit it belongs to (parallel.h).
#include <ATen/ATen.h>

#include <stdexcept>

#include "dion/comm/chunks.h"
#include "../parallel/detail.h"

namespace dion::train {

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

namespace detail {
std::string unit_of(const std::string& name) {
  const std::string pre = "transformer.h.";
  if (name.rfind(pre, 0) != 0) return name;
  return name.substr(0, name.find('.', pre.size()) + 1);
}

}  // namespace detail

ParamPlacement placement_of(const std::string& name, const std::vector<int64_t>& global_shape, const MeshShape& m) {
  ParamPlacement p{name, global_shape};
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

at::Tensor local_part(const at::Tensor& full, const ParamPlacement& p, int fs_size, int fs_rank, int tp_size,
                      int tp_rank, int ep_size, int ep_rank) {
  at::Tensor t = full;
  if (p.ep_dim >= 0) t = comm::shard_tensor(t, p.ep_dim, ep_size, ep_rank);
  if (p.efs > 1) t = comm::shard_tensor(t, p.ep_dim, int(p.efs), fs_rank / ep_size);  // fs rank b * ep + e
  if (p.tp_dim >= 0) t = comm::shard_tensor(t, p.tp_dim, tp_size, tp_rank);
  if (p.fs_dim >= 0) t = comm::shard_tensor(t, p.fs_dim, fs_size, fs_rank);
  return t.contiguous();
}

Box local_box(const ParamPlacement& p, int fs_size, int fs_rank, int tp_size, int tp_rank, int ep_size,
              int ep_rank) {
  Box b{std::vector<int64_t>(p.global_shape.size(), 0), p.global_shape};
  if (p.ep_dim >= 0) {
    const comm::Chunk c = comm::shard_range(b.length[p.ep_dim], ep_size, ep_rank);
    b.start[p.ep_dim] = c.start;
    b.length[p.ep_dim] = c.length;
  }
  if (p.efs > 1) {
    const comm::Chunk c = comm::shard_range(b.length[p.ep_dim], int(p.efs), fs_rank / ep_size);
    b.start[p.ep_dim] += c.start;
    b.length[p.ep_dim] = c.length;
  }
  if (p.tp_dim >= 0) {
    const comm::Chunk c = comm::shard_range(b.length[p.tp_dim], tp_size, tp_rank);
    b.start[p.tp_dim] += c.start;
    b.length[p.tp_dim] = c.length;
  }
  if (p.fs_dim >= 0) {
    const comm::Chunk c = comm::shard_range(b.length[p.fs_dim], fs_size, fs_rank);
    b.start[p.fs_dim] += c.start;
    b.length[p.fs_dim] = c.length;
  }
  return b;
}

}  // namespace dion::train
