// dion/dist/mesh.h — compatibility: DeviceMesh moved to dion_comm (dion/comm/mesh.h); the old
// name dion::dist::DeviceMesh stays valid.
#pragma once

#include "dion/comm/mesh.h"
#include "dion/dist/group.h"

namespace dion::dist {
using comm::DeviceMesh;
}  // namespace dion::dist
