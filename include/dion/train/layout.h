// dion/train/layout.h — who holds which part of each GPT parameter at a mesh shape. Pure
// arithmetic on names, shapes and ranks: no groups, no collectives. The runtime (parallel.h),
// the gradient norm, the replica check, the checkpoints and QK-clip all ask it.
//
//   Layout L(MeshShape{dp, fs, tp, ep});
//   Placement pl = L.place("transformer.h.0.attn.c_q.weight", {768, 768});  // the GPT's plan
//   L.box(pl, rank)      // the [start, length) box of `rank`'s part, per dim
//   L.part(whole, pl, rank), L.counts(pl, rank), L.owners(pl), L.replica_axis(pl)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "dion/train/mesh_shape.h"

namespace dion::train {

// How one parameter is split: its global shape, the dim split over fs and over tp (-1: none),
// whether the tp shards are gathered for compute (wte, lm_head), and for an MoE expert stack the
// dim split over ep, whose parts are split again over efs ranks (EP x FSDP, mesh_shape.h).
struct Placement {
  std::string name;
  std::vector<int64_t> global_shape;
  int64_t fs_dim = -1, tp_dim = -1;
  bool tp_gather = false;
  int64_t ep_dim = -1;
  int64_t efs = 1;
};

// The split's fields as meta.json names them, each with its value when unsplit; `always`: written
// even then. The checkpoints write and read a placement through this table.
struct SplitField {
  const char* key;
  int64_t Placement::*field;
  int64_t unsplit;
  bool always;
};
const std::vector<SplitField>& split_fields();

struct Box {
  std::vector<int64_t> start, length;
};

// A rank's place on the mesh: rank = (dp * fs + fs_rank) * tp + tp_rank (tp fastest, torch's
// init_device_mesh); data = dp * fs + fs_rank. Under ep: ep = data % ep, the expert replica
// index edp (data / ep; the dp index under EP x FSDP), efs_rank = fs_rank / ep.
struct MeshCoord {
  int64_t dp = 0, fs = 0, tp = 0, data = 0, ep = 0, edp = 0, efs = 0;
};

// The replicas of a part (the ranks holding identical copies, whose gradients are summed): a
// dense parameter's over dp, an expert stack's under ep over edp (each its own group).
enum class ReplicaAxis { dp = 0, edp = 1 };
constexpr int kReplicaAxes = 2;
const char* replica_axis_name(ReplicaAxis a);  // "dp", "edp"

class Layout {
 public:
  explicit Layout(MeshShape shape = {}) : shape_(shape) {}
  const MeshShape& shape() const { return shape_; }
  int world_size() const { return int(shape_.world()); }
  MeshCoord coord(int rank) const;

  // The GPT's plan (src/train/parallel/plan.cpp): where the parameter `name` lives. Throws
  // logic_error for a name the plan does not know.
  Placement place(const std::string& name, const std::vector<int64_t>& global_shape) const;

  // `rank`'s part: its box in the global tensor, and that part cut from a whole tensor.
  Box box(const Placement& p, int rank) const;
  at::Tensor part(const at::Tensor& whole, const Placement& p, int rank) const;

  ReplicaAxis replica_axis(const Placement& p) const { return p.ep_dim >= 0 ? ReplicaAxis::edp : ReplicaAxis::dp; }
  // `rank`'s part is a copy of tp rank 0's (whole on every tp rank: an MoE's experts, routers).
  bool tp_copy(const Placement& p, int rank) const;
  // `rank` counts its part once for the whole world (norms, saves): the first of its replicas,
  // and not a tp copy. The parts of the counting ranks tile the tensor exactly once.
  bool counts(const Placement& p, int rank) const;
  std::vector<int> owners(const Placement& p) const;  // the counting ranks, ascending

 private:
  MeshShape shape_;
};

// The placement of every parameter of a model at this rank, by parameter identity, and in the
// model's order (what the runtime and the checkpoint writer iterate).
class Placements {
 public:
  void add(const at::Tensor& param, Placement p);
  void clear();
  const Placement& of(const at::Tensor& param) const;
  const Placement& of(const void* key) const;  // key: the parameter's TensorImpl
  const std::vector<Placement>& ordered() const { return ordered_; }

 private:
  std::unordered_map<const void*, Placement> by_key_;
  std::vector<Placement> ordered_;
};

}  // namespace dion::train
