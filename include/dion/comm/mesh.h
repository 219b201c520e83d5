// dion/comm/mesh.h — an N-D device mesh with named axes over a world Group.
//
//   auto world = dion::comm::Group::init_from_env();
//   dion::comm::DeviceMesh mesh(world, {{"dp", 2}, {"fs", 2}});   // checks 2 * 2 == world size
//   mesh.axis("fs");               // this rank's sub-group along "fs" (size 2)
//   mesh.flatten({"dp", "fs"});    // one group spanning both axes (size 4)
//   mesh.coordinate("dp");         // this rank's index along "dp"
//
// Ranks are laid out row-major: the last axis varies fastest (as torch's init_device_mesh).
// Building a mesh is collective: every rank of the world constructs it with the same shape.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dion/comm/group.h"

namespace dion::comm {

class DeviceMesh {
 public:
  // Throws dion::ValueError when the product of the axis sizes is not the world size, an axis
  // size is < 1, or a name repeats; the message names the axes and the world size.
  DeviceMesh(Group world, std::vector<std::pair<std::string, int>> axes);

  Group& world() { return world_; }
  int ndim() const { return static_cast<int>(axes_.size()); }
  int size(const std::string& axis) const;
  int coordinate(const std::string& axis) const;
  const std::vector<std::pair<std::string, int>>& axes() const { return axes_; }

  // This rank's group along one axis, or along several axes flattened into one.
  std::shared_ptr<Group> axis(const std::string& name);
  std::shared_ptr<Group> flatten(const std::vector<std::string>& names);

 private:
  int axis_index(const std::string& name) const;

  Group world_;
  std::vector<std::pair<std::string, int>> axes_;
  std::vector<int> coords_;  // this rank's coordinate per axis
  std::map<std::string, std::shared_ptr<Group>> groups_;
};

}  // namespace dion::comm
