// src/train/parallel/mesh.cpp — the training mesh's groups (mesh.h).
#include "dion/train/mesh.h"

#include <fmt/format.h>

#include <stdexcept>

#include "dion/train/config.h"

namespace dion::train {

Mesh::Mesh(comm::Group world, MeshShape shape) : world_(std::move(world)), layout_(shape) {
  if (shape.world() != world_.size())
    throw ConfigError(
        fmt::format("dp_size {} x fs_size {} x tp_size {} = {}, but WORLD_SIZE is {}: the product of "
                    "the mesh sizes must equal the number of processes",
                    shape.dp, shape.fs, shape.tp, shape.world(), world_.size()));
  coord_ = layout_.coord(world_.rank());
  auto& g = groups_;
  mesh_ = std::make_unique<comm::DeviceMesh>(
      world_, std::vector<std::pair<std::string, int>>{{"dp", int(shape.dp)}, {"fs", int(shape.fs)}, {"tp", int(shape.tp)}});
  g[int(Axis::dp)] = mesh_->axis("dp");
  g[int(Axis::fs)] = mesh_->axis("fs");
  g[int(Axis::tp)] = mesh_->axis("tp");
  g[int(Axis::data)] = mesh_->flatten({"dp", "fs"});
  if (shape.ep == 1) return;
  // config_validate has refused the rest; a logic error here means a caller skipped it.
  if ((shape.dp * shape.fs) % shape.ep != 0) throw std::logic_error("parallel layout: ep must divide dp x fs");
  const int ep = int(shape.ep), efs = int(shape.efs()), tp = int(shape.tp);
  if (efs == 1) {
    // rank = (b * ep + e) * tp + t = data rank * tp + t, as the (dp, fs, tp) mesh.
    ep_mesh_ = std::make_unique<comm::DeviceMesh>(
        world_, std::vector<std::pair<std::string, int>>{{"edp", int(shape.dp * shape.fs / shape.ep)}, {"ep", ep}, {"tp", tp}});
    g[int(Axis::ep)] = ep_mesh_->axis("ep");
    g[int(Axis::edp)] = ep_mesh_->axis("edp");
    return;
  }
  // EP x FSDP: rank = ((d * efs + b) * ep + e) * tp + t, fs rank f = b * ep + e.
  ep_mesh_ = std::make_unique<comm::DeviceMesh>(
      world_, std::vector<std::pair<std::string, int>>{{"dp", int(shape.dp)}, {"efs", efs}, {"ep", ep}, {"tp", tp}});
  g[int(Axis::ep)] = ep_mesh_->axis("ep");
  g[int(Axis::edp)] = ep_mesh_->axis("dp");  // the replicas of this rank's expert shard
  g[int(Axis::efs)] = ep_mesh_->axis("efs");
  // The stack's group, e-major: member e * efs + b holds chunk e * efs + b of dim 0, which is
  // chunk b of ep rank e's experts. Every rank creates every such group, in the same order.
  for (int d = 0; d < int(shape.dp); ++d)
    for (int t = 0; t < tp; ++t) {
      std::vector<int> ranks;
      for (int e = 0; e < ep; ++e)
        for (int b = 0; b < efs; ++b) ranks.push_back(((d * efs + b) * ep + e) * tp + t);
      auto sub = world_.subgroup(ranks, fmt::format("experts@{}.{}", d, t));
      if (sub) g[int(Axis::experts)] = std::move(sub);
    }
}

const std::shared_ptr<comm::Group>& Mesh::group(Axis a) const { return groups_[int(a)]; }

const std::shared_ptr<comm::Group>& Mesh::replicas(ReplicaAxis a) const {
  return groups_[int(a == ReplicaAxis::edp ? Axis::edp : Axis::dp)];
}

}  // namespace dion::train
