// fake_distribution.h — W simulated ranks in ONE process, for testing the optimizer's
// communication patterns (dion/optim/collectives.h) without processes.
//
//   dion::testing::FakeWorld world(/*outer=*/2, /*inner=*/2);    // a 2 x 2 mesh, 4 ranks
//   world.run([&](int r) {                                      // every rank's code, on one thread
//     auto dist = world.distribution(r);
//     dist->shard(local[r], global_shape, /*dim=*/0, /*inner_dim=*/1);
//     dion::Optimizer opt(params[r], options, {}, dist);
//     opt.step();
//   });
//
// run() runs each rank's function as a dion::comm::run_tasks task (W in flight, one thread). A
// rank's collective deposits its tensor and yields until every member of its group has arrived,
// then every member reads all of them (group-rank order); so the ranks interleave exactly at
// their collectives, deterministically. Each rank keeps its own CPU generator state across its
// collectives (all start from the state run() was called with), as identically seeded processes
// would. A collective that not every member reaches (a rank failed, or the ranks issued different
// collectives) throws std::runtime_error after a bounded number of rounds instead of hanging; a
// mismatch of collective kinds in one slot throws at once.
//
// Ranks: r = outer_rank * inner + inner_rank. The outer (FSDP / DDP) group of r holds the ranks
// of its inner rank, the inner (TP) group those of its outer rank. No replicate axis.
// The fake is only the per-axis collectives (dion::AxisGroup): a FakeDistribution is a
// dion::Distribution over in-process axis groups, so the layouts, their checks and the
// megabatch assembly are the production ones (src/optim/assembly.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dion/optim/distribution.h"

namespace dion::testing {

class FakeWorld;

// One axis of one simulated rank: its collectives go through FakeWorld::exchange.
class FakeAxis : public AxisGroup {
 public:
  FakeAxis(FakeWorld& world, Axis axis, int rank, std::shared_ptr<std::map<std::string, int>> calls,
           std::string name = "")
      : world_(world), axis_(axis), rank_(rank), calls_(std::move(calls)), name_(std::move(name)) {}
  int size() const override;
  int rank() const override;
  std::string name() const override;
  c10::Device control_device() const override { return c10::Device(c10::kCPU); }
  void all_reduce_(at::Tensor& x) override;
  at::Tensor all_gather(const at::Tensor& x) override;
  at::Tensor all_to_all(const at::Tensor& x) override;

 private:
  FakeWorld& world_;
  Axis axis_;
  int rank_;
  std::shared_ptr<std::map<std::string, int>> calls_;  // the rank's, shared by its axes
  std::string name_;                                   // empty: "fake outer" / "fake inner"
};

class FakeDistribution : public Distribution {
  friend class FakeWorld;

 public:
  FakeDistribution(FakeWorld& world, int rank);

  // Collectives this rank issued, by kind ("all_reduce", "all_gather", "all_to_all").
  const std::map<std::string, int>& calls() const { return *calls_; }

 private:
  FakeDistribution(FakeWorld& world, int rank, std::shared_ptr<std::map<std::string, int>> calls);
  std::shared_ptr<std::map<std::string, int>> calls_;
};

class FakeWorld {
 public:
  explicit FakeWorld(int outer, int inner = 1);
  int size() const { return outer_ * inner_; }
  int outer() const { return outer_; }
  int inner() const { return inner_; }
  const std::shared_ptr<FakeDistribution>& distribution(int rank) const { return dists_.at(static_cast<size_t>(rank)); }

  // Run fn(rank) for every rank, interleaved at their collectives (see above). Rethrows the
  // first rank's error (in rank order) once every rank has finished.
  void run(const std::function<void(int)>& fn);

  // The collective primitive: every member of `rank`'s group along `axis` contributes `x`
  // (`kind` names the collective); returns all contributions in group-rank order.
  std::vector<at::Tensor> exchange(const std::string& kind, Axis axis, int rank, const at::Tensor& x);

  int axis_size(Axis axis) const;
  int axis_rank(Axis axis, int rank) const;

  // Another handle on `rank`'s group along `axis` (OUTER or INNER), e.g. an expert-parallel group
  // for Distribution::shard_over, or the outer axis alone for a Distribution without the inner
  // one. Its collectives are counted in `calls` (null: in the rank's distribution's calls()) and
  // share the axis's sequence: every member must issue them in the same order with the axis's.
  std::shared_ptr<AxisGroup> axis_group(int rank, Axis axis,
                                        std::shared_ptr<std::map<std::string, int>> calls = nullptr,
                                        std::string name = "");

 private:
  struct Slot {
    std::string kind;
    std::vector<at::Tensor> parts;
    size_t arrived = 0, read = 0;
  };
  using Key = std::tuple<int, int, int>;  // (axis, group id, sequence number)

  int outer_, inner_;
  std::vector<std::shared_ptr<FakeDistribution>> dists_;
  std::map<Key, Slot> slots_;
  std::map<std::pair<int, int>, int> sequence_;  // (rank, axis) -> collectives issued
};

}  // namespace dion::testing
