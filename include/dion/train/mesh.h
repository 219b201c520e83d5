// dion/train/mesh.h — a training run's device mesh: its shape, this rank's place on it, and the
// process groups of each axis. Building it is collective (every rank, same shape).
//
//   Mesh mesh(world, {dp, fs, tp, ep});  // throws ConfigError on every rank when dp*fs*tp != world
//   mesh.group(Axis::fs), mesh.replicas(ReplicaAxis::edp), mesh.layout().box(placement, mesh.rank())
#pragma once

#include <memory>

#include "dion/comm/group.h"
#include "dion/comm/mesh.h"
#include "dion/train/layout.h"

namespace dion::train {

// The groups a rank belongs to. dp, fs, tp: the (dp, fs, tp) mesh's axes; data: dp x fs
// flattened. Under ep (null otherwise): ep, and edp (the ranks holding the same experts). Under
// EP x FSDP (MeshShape::efs() > 1; null otherwise): efs (the ranks splitting this rank's
// experts) and experts (the ep x efs ranks splitting a whole stack, member e * efs + b holding
// its (e * efs + b)-th chunk of dim 0: the optimizer's group for the stacks).
enum class Axis { dp, fs, tp, data, ep, edp, efs, experts };

class Mesh {
 public:
  Mesh(comm::Group world, MeshShape shape);

  comm::Group& world() { return world_; }
  int rank() const { return world_.rank(); }
  int world_size() const { return world_.size(); }
  bool is_main() const { return world_.rank() == 0; }
  const MeshShape& shape() const { return layout_.shape(); }
  const Layout& layout() const { return layout_; }
  const MeshCoord& coord() const { return coord_; }  // this rank's
  int data_size() const { return int(shape().dp * shape().fs); }

  const std::shared_ptr<comm::Group>& group(Axis a) const;  // null: not in this layout
  // The group of a part's replicas (layout.h): dp, or edp (null without ep: no part is there).
  const std::shared_ptr<comm::Group>& replicas(ReplicaAxis a) const;
  // Bytes this process's collectives sent so far (every sub-group counts into the world's).
  int64_t bytes_sent() const { return world_.stats().total_bytes(); }

 private:
  comm::Group world_;
  Layout layout_;
  MeshCoord coord_;
  std::unique_ptr<comm::DeviceMesh> mesh_, ep_mesh_;
  std::shared_ptr<comm::Group> groups_[8];
};

}  // namespace dion::train
