// fake_distribution.h — W simulated ranks in ONE process, for testing the optimizer's
// communication patterns (src/optim/collectives.h) without processes.
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
// FakeDistribution's orthogonalize assembles whole matrices by all_gather (every rank
// orthogonalizes all of them) — a different route from dion::dist::Distributed's all_to_all,
// with the same result.
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

class FakeDistribution : public Distribution {
 public:
  FakeDistribution(FakeWorld& world, int rank) : world_(world), rank_(rank) {}

  // `local` is this rank's FSDP2 chunk along `dim` (and along `inner_dim` over the inner group
  // when >= 0) of a parameter of `global_shape`. Unregistered parameters are replicated (DDP)
  // when the outer group has more than one rank.
  void shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim, int64_t inner_dim = -1);

  int axis_size(Axis axis) const override;
  int axis_rank(Axis axis) const override;
  void all_reduce_(at::Tensor& x, Axis axis) override;
  at::Tensor all_gather(const at::Tensor& x, Axis axis) override;
  at::Tensor all_to_all(const at::Tensor& x, Axis axis) override;
  Layout layout(const at::Tensor& param) const override;
  at::Tensor orthogonalize(std::vector<at::Tensor> U, const Layout& layout, const OrthoRequest& request) override;
  void sum_over_shards_(at::Tensor& x) override;
  at::Tensor gather_over_shards(const at::Tensor& x) override { return all_gather(x, Axis::OUTER); }
  int rank() const override { return axis_rank(Axis::OUTER); }
  void average_over_replicas_(at::Tensor& x) override;
  int world_size() const override { return axis_size(Axis::OUTER); }

  // Collectives this rank issued, by kind ("all_reduce", "all_gather", "all_to_all").
  const std::map<std::string, int>& calls() const { return calls_; }

 private:
  // Whole matrices along `dim` (negative) over `axis`, `apply`, this rank's part back.
  at::Tensor assemble_apply(Axis axis, std::vector<at::Tensor> U, int64_t dim, int64_t global_size,
                            int64_t local_size, const std::function<at::Tensor(const at::Tensor&)>& apply);

  FakeWorld& world_;
  int rank_;
  std::map<void*, Layout> layouts_;
  std::map<std::string, int> calls_;
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
