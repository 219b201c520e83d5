// The state behind a dion::comm::Work (include/dion/comm/work.h): the issued c10d Work and what
// a failure message names. Private to dion_comm (group.cpp issues, work.cpp waits).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <string>

#include "dion/comm/work.h"

namespace dion::comm {

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;  // null once waited (or when nothing was issued)
  at::Tensor result;
  std::string kind;   // "all_gather", ...
  std::string group;  // the group's name
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  bool waited = false;
  std::exception_ptr error;  // a failed wait: every later wait() rethrows it
};

// "all_gather on group 'world' (rank 0 of 2) failed; timeout 5000 ms. A peer may have died.
// Cause: <c10d's message>" as a CommError.
[[noreturn]] void throw_comm_error(const std::string& kind, const std::string& group, int rank, int size,
                                   std::chrono::milliseconds timeout, const std::exception& cause);

}  // namespace dion::comm
