// Device mesh (see include/dion/comm/mesh.h).
#include "dion/comm/mesh.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "dion/errors.h"

namespace dion::comm {

DeviceMesh::DeviceMesh(Group world, std::vector<std::pair<std::string, int>> axes)
    : world_(std::move(world)), axes_(std::move(axes)) {
  std::ostringstream desc;
  int64_t product = 1;
  std::set<std::string> names;
  for (const auto& [name, n] : axes_) {
    desc << (names.empty() ? "" : " x ") << name << "=" << n;
    if (n < 1) throw ValueError("device mesh: axis '" + name + "' has size " + std::to_string(n) + " (must be >= 1)");
    if (!names.insert(name).second) throw ValueError("device mesh: axis name '" + name + "' appears twice");
    product *= n;
  }
  if (product != world_.size())
    throw ValueError("device mesh " + desc.str() + " has " + std::to_string(product) + " ranks but the world has " +
                     std::to_string(world_.size()) + ": the product of the axis sizes must equal the world size");
  int r = world_.rank();
  coords_.assign(axes_.size(), 0);
  for (int i = static_cast<int>(axes_.size()) - 1; i >= 0; --i) {
    coords_[i] = r % axes_[i].second;
    r /= axes_[i].second;
  }
}

int DeviceMesh::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].first == name) return static_cast<int>(i);
  std::string known;
  for (const auto& a : axes_) known += (known.empty() ? "" : ", ") + a.first;
  throw ValueError("device mesh has no axis '" + name + "' (axes: " + known + ")");
}

int DeviceMesh::size(const std::string& axis) const { return axes_[axis_index(axis)].second; }
int DeviceMesh::coordinate(const std::string& axis) const { return coords_[axis_index(axis)]; }

std::shared_ptr<Group> DeviceMesh::axis(const std::string& name) { return flatten({name}); }

std::shared_ptr<Group> DeviceMesh::flatten(const std::vector<std::string>& names) {
  std::string key;
  std::vector<int> idx;
  for (const auto& n : names) {
    key += (key.empty() ? "" : "+") + n;
    idx.push_back(axis_index(n));
  }
  if (auto it = groups_.find(key); it != groups_.end()) return it->second;
  // Every group along these axes: fix the other coordinates, vary the named ones. Each rank
  // builds only the group it belongs to (members rendezvous under the group's own prefix).
  const int nd = ndim();
  std::vector<int> stride(nd, 1);
  for (int i = nd - 2; i >= 0; --i) stride[i] = stride[i + 1] * axes_[i + 1].second;
  int base = 0;
  for (int i = 0; i < nd; ++i)
    if (std::find(idx.begin(), idx.end(), i) == idx.end()) base += coords_[i] * stride[i];
  std::vector<int> ranks = {base};
  for (int i : idx) {  // first named axis varies slowest
    std::vector<int> next;
    for (int r : ranks)
      for (int c = 0; c < axes_[i].second; ++c) next.push_back(r + c * stride[i]);
    ranks = std::move(next);
  }
  std::sort(ranks.begin(), ranks.end());
  std::string name = key + "@";
  for (int i = 0; i < nd; ++i)
    if (std::find(idx.begin(), idx.end(), i) == idx.end()) name += std::to_string(coords_[i]) + ".";
  auto g = world_.subgroup(ranks, name);
  groups_[key] = g;
  return g;
}

}  // namespace dion::comm
