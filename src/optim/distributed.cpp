// The optimizer's Distribution over dion_comm groups (see include/dion/optim/distributed.h).
#include "dion/optim/distributed.h"

#include "dion/errors.h"

namespace dion {

namespace {
std::shared_ptr<AxisGroup> axis_of(const std::shared_ptr<comm::Group>& g, const char* what) {
  if (!g) throw ValueError(std::string("Distributed: the ") + what + " is null (this rank is not a member?)");
  return std::make_shared<GroupAxis>(g);
}
}  // namespace

Distributed::Distributed(std::shared_ptr<comm::Group> group, bool sync_gradients)
    : Distribution(axis_of(group, "group"), nullptr, sync_gradients), group_(std::move(group)) {
  overlap(3);  // the reference's megabatch tasks in flight
}

Distributed::Distributed(std::shared_ptr<comm::Group> outer, std::shared_ptr<comm::Group> inner)
    : Distribution(axis_of(outer, "group"), axis_of(inner, "inner (TP) group")), group_(std::move(outer)) {
  overlap(3);
}

Distributed& Distributed::replicate(std::shared_ptr<comm::Group> replicate, bool sync_gradients) {
  if (!replicate) throw ValueError("Distributed::replicate: the group is null (this rank is not a member?)");
  Distribution::replicate(std::make_shared<GroupAxis>(std::move(replicate)), sync_gradients);
  return *this;
}

}  // namespace dion
