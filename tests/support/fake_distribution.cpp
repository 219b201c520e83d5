// W simulated ranks in one process (see fake_distribution.h).
#include "fake_distribution.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

#include "dion/comm/tasks.h"

namespace dion::testing {

namespace {
constexpr int kMaxRounds = 100000;  // rounds a collective waits for its members before giving up
}  // namespace

// ---------------------------------------------------------------------------- FakeWorld

FakeWorld::FakeWorld(int outer, int inner) : outer_(outer), inner_(inner) {
  if (outer < 1 || inner < 1) throw std::invalid_argument("FakeWorld: axis sizes must be >= 1");
  for (int r = 0; r < size(); ++r) dists_.push_back(std::make_shared<FakeDistribution>(*this, r));
}

int FakeWorld::axis_size(Axis axis) const { return axis == Axis::OUTER ? outer_ : axis == Axis::INNER ? inner_ : 1; }

int FakeWorld::axis_rank(Axis axis, int rank) const {
  return axis == Axis::OUTER ? rank / inner_ : axis == Axis::INNER ? rank % inner_ : 0;
}

std::shared_ptr<AxisGroup> FakeWorld::axis_group(int rank, Axis axis, std::shared_ptr<std::map<std::string, int>> calls,
                                                 std::string name) {
  if (axis == Axis::REPLICA) throw std::invalid_argument("FakeWorld::axis_group: the fake has no replica axis");
  if (!calls) calls = dists_.at(static_cast<size_t>(rank))->calls_;
  return std::make_shared<FakeAxis>(*this, axis, rank, std::move(calls), std::move(name));
}

void FakeWorld::run(const std::function<void(int)>& fn) {
  auto gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor start = gen.get_state();
  std::vector<comm::Task> tasks;
  for (int r = 0; r < size(); ++r)
    tasks.push_back({[&fn, &gen, start, r] {
      gen.set_state(start);  // every rank starts from the same generator state
      fn(r);
    }});
  comm::run_tasks(tasks, size());
}

std::vector<at::Tensor> FakeWorld::exchange(const std::string& kind, Axis axis, int rank, const at::Tensor& x) {
  const int members = axis_size(axis);
  const int group = axis == Axis::OUTER ? axis_rank(Axis::INNER, rank) : axis_rank(Axis::OUTER, rank);
  const int seq = sequence_[{rank, static_cast<int>(axis)}]++;
  const Key key{static_cast<int>(axis), group, seq};
  {
    Slot& slot = slots_[key];
    if (slot.parts.empty()) {
      slot.kind = kind;
      slot.parts.resize(static_cast<size_t>(members));
    } else if (slot.kind != kind) {
      throw std::runtime_error("fake collective #" + std::to_string(seq) + ": rank " + std::to_string(rank) +
                               " issued " + kind + " where another member issued " + slot.kind);
    }
    slot.parts[static_cast<size_t>(axis_rank(axis, rank))] = x.clone();
    ++slot.arrived;
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  for (int round = 0; slots_.at(key).arrived < static_cast<size_t>(members); ++round) {
    if (!comm::in_task() || round == kMaxRounds)
      throw std::runtime_error("fake collective " + kind + " #" + std::to_string(seq) + " on rank " +
                               std::to_string(rank) + ": not every member of its group arrived");
    const at::Tensor mine = gen.get_state();  // this rank's generator, kept across the switch
    comm::yield();
    gen.set_state(mine);
  }
  Slot& slot = slots_.at(key);
  std::vector<at::Tensor> out = slot.parts;
  if (++slot.read == static_cast<size_t>(members)) slots_.erase(key);
  return out;
}

// ---------------------------------------------------------------------------- FakeAxis

int FakeAxis::size() const { return world_.axis_size(axis_); }
int FakeAxis::rank() const { return world_.axis_rank(axis_, rank_); }
std::string FakeAxis::name() const {
  if (!name_.empty()) return name_;
  return axis_ == Axis::OUTER ? "fake outer" : "fake inner";
}

void FakeAxis::all_reduce_(at::Tensor& x) {
  if (size() <= 1) return;
  ++(*calls_)["all_reduce"];
  std::vector<at::Tensor> parts = world_.exchange("all_reduce", axis_, rank_, x);
  at::Tensor sum = parts[0].clone();
  for (size_t i = 1; i < parts.size(); ++i) sum.add_(parts[i]);  // group-rank order
  x.copy_(sum);
}

at::Tensor FakeAxis::all_gather(const at::Tensor& x) {
  if (size() <= 1) return x.unsqueeze(0);
  ++(*calls_)["all_gather"];
  return at::stack(world_.exchange("all_gather", axis_, rank_, x), 0);
}

at::Tensor FakeAxis::all_to_all(const at::Tensor& x) {
  const int W = size();
  if (W <= 1) return x;
  ++(*calls_)["all_to_all"];
  std::vector<at::Tensor> parts = world_.exchange("all_to_all", axis_, rank_, x);
  const int64_t me = rank();
  std::vector<at::Tensor> mine;  // chunk `me` of every member's tensor, in member order
  for (const at::Tensor& p : parts) mine.push_back(p.chunk(W, 0)[static_cast<size_t>(me)]);
  return at::cat(mine, 0);
}

// ---------------------------------------------------------------------------- FakeDistribution

FakeDistribution::FakeDistribution(FakeWorld& world, int rank)
    : FakeDistribution(world, rank, std::make_shared<std::map<std::string, int>>()) {}

FakeDistribution::FakeDistribution(FakeWorld& world, int rank, std::shared_ptr<std::map<std::string, int>> calls)
    : Distribution(std::make_shared<FakeAxis>(world, Axis::OUTER, rank, calls),
                   std::make_shared<FakeAxis>(world, Axis::INNER, rank, calls)),
      calls_(std::move(calls)) {}

}  // namespace dion::testing
