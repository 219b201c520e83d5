// W simulated ranks in one process (see fake_distribution.h).
#include "fake_distribution.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

#include "dion/comm/tasks.h"

namespace dion::testing {

namespace {
constexpr int kMaxRounds = 100000;  // rounds a collective waits for its members before giving up

at::Tensor pad_to(const at::Tensor& t, int64_t dim, int64_t size) {
  const int64_t have = t.size(dim);
  if (have == size) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim < 0 ? dim + t.dim() : dim] = size - have;
  return at::cat({t, at::zeros(shape, t.options())}, dim);
}
}  // namespace

// ---------------------------------------------------------------------------- FakeWorld

FakeWorld::FakeWorld(int outer, int inner) : outer_(outer), inner_(inner) {
  if (outer < 1 || inner < 1) throw std::invalid_argument("FakeWorld: axis sizes must be >= 1");
  for (int r = 0; r < size(); ++r) dists_.push_back(std::make_shared<FakeDistribution>(*this, r));
}

int FakeWorld::axis_size(Axis axis) const {
  return axis == Axis::OUTER ? outer_ : axis == Axis::INNER ? inner_ : 1;
}

int FakeWorld::axis_rank(Axis axis, int rank) const {
  return axis == Axis::OUTER ? rank / inner_ : axis == Axis::INNER ? rank % inner_ : 0;
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

// ---------------------------------------------------------------------------- FakeDistribution

void FakeDistribution::shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim,
                             int64_t inner_dim) {
  layouts_[local.unsafeGetTensorImpl()] = Layout{std::move(global_shape), dim, false, inner_dim};
}

int FakeDistribution::axis_size(Axis axis) const { return world_.axis_size(axis); }
int FakeDistribution::axis_rank(Axis axis) const { return world_.axis_rank(axis, rank_); }

void FakeDistribution::all_reduce_(at::Tensor& x, Axis axis) {
  if (axis_size(axis) <= 1) return;
  ++calls_["all_reduce"];
  std::vector<at::Tensor> parts = world_.exchange("all_reduce", axis, rank_, x);
  at::Tensor sum = parts[0].clone();
  for (size_t i = 1; i < parts.size(); ++i) sum.add_(parts[i]);  // group-rank order
  x.copy_(sum);
}

at::Tensor FakeDistribution::all_gather(const at::Tensor& x, Axis axis) {
  if (axis_size(axis) <= 1) return x.unsqueeze(0);
  ++calls_["all_gather"];
  return at::stack(world_.exchange("all_gather", axis, rank_, x), 0);
}

at::Tensor FakeDistribution::all_to_all(const at::Tensor& x, Axis axis) {
  const int W = axis_size(axis);
  if (W <= 1) return x;
  ++calls_["all_to_all"];
  std::vector<at::Tensor> parts = world_.exchange("all_to_all", axis, rank_, x);
  const int64_t me = axis_rank(axis);
  std::vector<at::Tensor> mine;  // chunk `me` of every member's tensor, in member order
  for (const at::Tensor& p : parts) mine.push_back(p.chunk(W, 0)[static_cast<size_t>(me)]);
  return at::cat(mine, 0);
}

Layout FakeDistribution::layout(const at::Tensor& param) const {
  auto it = layouts_.find(param.unsafeGetTensorImpl());
  if (it != layouts_.end()) return it->second;
  return Layout{param.sizes().vec(), -1, axis_size(Axis::OUTER) > 1};
}

at::Tensor FakeDistribution::assemble_apply(Axis axis, std::vector<at::Tensor> U, int64_t dim, int64_t global_size,
                                            int64_t local_size,
                                            const std::function<at::Tensor(const at::Tensor&)>& apply) {
  const int W = axis_size(axis);
  const int64_t padded = local_size > 0 ? local_size : (global_size + W - 1) / W;
  const int64_t mine = U[0].size(dim);
  for (at::Tensor& u : U) u = pad_to(u, dim, padded);
  at::Tensor all = all_gather(at::stack(U, 0), axis);  // [W, N, ..padded..]
  at::Tensor whole = at::cat(all.unbind(0), dim);      // [N, ..W * padded..]
  at::Tensor out = apply(whole);
  return out.narrow(dim, padded * axis_rank(axis), padded).narrow(dim, 0, mine);
}

at::Tensor FakeDistribution::orthogonalize(std::vector<at::Tensor> U, const Layout& layout,
                                           const OrthoRequest& request) {
  if (layout.two_d()) {
    const int64_t nd = static_cast<int64_t>(layout.global_shape.size());
    auto outer_stage = [&](const at::Tensor& whole_inner) {
      return assemble_apply(Axis::OUTER, whole_inner.unbind(0), request.comm_dim, request.global_size,
                            request.local_size, request.apply);
    };
    return assemble_apply(Axis::INNER, std::move(U), layout.inner_dim - nd, layout.global_shape[layout.inner_dim],
                          request.inner_local_size, outer_stage);
  }
  if (layout.sharded())
    return assemble_apply(Axis::OUTER, std::move(U), request.comm_dim, request.global_size, request.local_size,
                          request.apply);
  return request.apply(at::stack(U, 0));  // replicated: every rank orthogonalizes every matrix
}

void FakeDistribution::sum_over_shards_(at::Tensor& x) {
  all_reduce_(x, Axis::OUTER);
  all_reduce_(x, Axis::INNER);
}

void FakeDistribution::average_over_replicas_(at::Tensor& x) {
  if (axis_size(Axis::OUTER) <= 1) return;
  all_reduce_(x, Axis::OUTER);
  x.div_(axis_size(Axis::OUTER));
}

}  // namespace dion::testing
