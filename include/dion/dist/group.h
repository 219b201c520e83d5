// dion/dist/group.h — compatibility: Group moved to dion_comm (dion/comm/group.h). The old
// names dion::dist::Group, CommError, CommStats, GroupOptions stay valid; new code includes
// dion/comm/group.h and says dion::comm.
#pragma once

#include "dion/comm/group.h"

namespace dion::dist {
using comm::CommError;
using comm::CommStats;
using comm::Group;
using comm::GroupOptions;
using comm::Work;
}  // namespace dion::dist
