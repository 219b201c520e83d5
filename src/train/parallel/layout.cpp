// src/train/parallel/layout.cpp — a rank's coordinate, its box of a parameter, and which ranks
// count each part once (layout.h). The plan by parameter name is plan.cpp.
#include "dion/train/layout.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "dion/comm/chunks.h"

namespace dion::train {

const char* replica_axis_name(ReplicaAxis a) { return a == ReplicaAxis::edp ? "edp" : "dp"; }

const std::vector<SplitField>& split_fields() {
  static const std::vector<SplitField> t = {{"fs_dim", &Placement::fs_dim, -1, true},
                                            {"tp_dim", &Placement::tp_dim, -1, true},
                                            {"ep_dim", &Placement::ep_dim, -1, false},
                                            {"efs", &Placement::efs, 1, false}};
  return t;
}

MeshCoord Layout::coord(int rank) const {
  const MeshShape& m = shape_;
  MeshCoord c;
  c.tp = rank % m.tp;
  c.data = rank / m.tp;
  c.fs = c.data % m.fs;
  c.dp = c.data / m.fs;
  c.edp = c.dp;
  if (m.ep > 1) {
    c.ep = c.data % m.ep;  // = fs rank % ep under EP x FSDP (ep divides fs)
    if (m.efs() > 1)
      c.efs = c.fs / m.ep;  // fs rank = efs rank * ep + ep rank
    else
      c.edp = c.data / m.ep;  // the data ranks holding the same experts
  }
  return c;
}

Box Layout::box(const Placement& p, int rank) const {
  const MeshCoord c = coord(rank);
  Box b{std::vector<int64_t>(p.global_shape.size(), 0), p.global_shape};
  auto split = [&](int64_t dim, int64_t parts, int64_t index) {
    const comm::Chunk k = comm::shard_range(b.length[dim], int(parts), int(index));
    b.start[dim] += k.start;
    b.length[dim] = k.length;
  };
  if (p.ep_dim >= 0) split(p.ep_dim, shape_.ep, c.ep);
  if (p.efs > 1) split(p.ep_dim, p.efs, c.efs);
  if (p.tp_dim >= 0) split(p.tp_dim, shape_.tp, c.tp);
  if (p.fs_dim >= 0) split(p.fs_dim, shape_.fs, c.fs);
  return b;
}

at::Tensor Layout::part(const at::Tensor& whole, const Placement& p, int rank) const {
  const Box b = box(p, rank);
  at::Tensor t = whole;
  for (size_t d = 0; d < b.start.size(); ++d)
    if (b.length[d] != whole.size(int64_t(d))) t = t.narrow(int64_t(d), b.start[d], b.length[d]);
  return t.contiguous();
}

bool Layout::tp_copy(const Placement& p, int rank) const {
  return shape_.tp > 1 && p.tp_dim < 0 && coord(rank).tp != 0;
}

bool Layout::counts(const Placement& p, int rank) const {
  const MeshCoord c = coord(rank);
  return !tp_copy(p, rank) && (replica_axis(p) == ReplicaAxis::edp ? c.edp : c.dp) == 0;
}

std::vector<int> Layout::owners(const Placement& p) const {
  std::vector<int> out;
  for (int r = 0; r < world_size(); ++r)
    if (counts(p, r)) out.push_back(r);
  return out;
}

void Placements::add(const at::Tensor& param, Placement p) {
  by_key_[param.unsafeGetTensorImpl()] = p;
  ordered_.push_back(std::move(p));
}

void Placements::clear() {
  by_key_.clear();
  ordered_.clear();
}

const Placement& Placements::of(const void* key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) throw std::logic_error("parallel layout: a parameter that shard_model did not place");
  return it->second;
}

const Placement& Placements::of(const at::Tensor& param) const { return of(param.unsafeGetTensorImpl()); }

}  // namespace dion::train
