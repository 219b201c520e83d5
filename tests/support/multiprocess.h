// multiprocess.h — the launcher and child helpers of the multi-process tests (test_dist,
// test_dist_agree, test_dist_checkpoint): Gloo over loopback, N real processes.
//
// A test binary's main() calls multiprocess_main(): run as `BINARY --child SCENARIO` it builds
// the world Group from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), runs
// the scenario and exits 0 when it reported no failure; otherwise it runs GoogleTest, whose
// tests call launch() / expect_all_ok() to start N copies of the binary and wait for them
// (killing all after a deadline). Not here: the scenarios themselves.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dion/comm/group.h"

namespace dion::testing {

// ---------------------------------------------------------------------------- parent

struct RunResult {
  std::vector<int> exit_codes;  // -1: killed at the deadline
  double seconds = 0;
};

// Start `world` copies of this binary running `scenario` and wait for them (at most deadline_s).
RunResult launch(const std::string& scenario, int world, int deadline_s = 120);
// launch() and EXPECT every rank to exit 0.
void expect_all_ok(const std::string& scenario, int world);

// ---------------------------------------------------------------------------- child

struct Child {
  explicit Child(comm::Group g) : world(std::move(g)) {}
  comm::Group world;
  int failures = 0;

  // Relative difference max|a - e| / max|e| against `tol`; printed on rank 0 and on mismatch.
  void compare(const std::string& what, const at::Tensor& actual, const at::Tensor& expected, double tol);
  // Count a failure with a message (printed on every rank).
  void fail(const std::string& what);
};

// Full parameters and gradients, identical on every rank (drawn from `seed`).
struct Problem {
  std::vector<at::Tensor> params;
  std::vector<std::vector<at::Tensor>> grads;  // [step][param]
};
Problem make_problem(const std::vector<std::vector<int64_t>>& shapes, int steps, uint64_t seed);

using Scenario = std::function<void(Child&)>;

// main() of a multi-process test binary (see the top of this file). `timeout_of` gives a
// scenario's collective timeout (default 60 s).
int multiprocess_main(int argc, char** argv, const std::map<std::string, Scenario>& scenarios,
                      const std::function<std::chrono::seconds(const std::string&)>& timeout_of = nullptr);

}  // namespace dion::testing
