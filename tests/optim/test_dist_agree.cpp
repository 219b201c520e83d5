// Ranks that disagree on the optimizer: every rank raises a clear error (src/optim/agreement.h).
//
// The bugs this pins: Dion2 with fraction 0.25 on one rank and 1.0 on the other aborted a rank
// inside Gloo ("Received data size doesn't match"); a rank holding 3 of the other's 5
// parameters finished with exit code 0 and a silently wrong 4th matrix (9e-2 off the
// single-process result). Now the first step compares every rank's description of its
// parameters (global shapes, dtypes, layouts, algorithm, communication options) and raises
// dion::ValueError on EVERY rank, naming the parameter and both values. Each scenario below
// checks that the error reached every rank (exit code 0 of each child means: it raised, with a
// message naming what it should) — including ranks whose own neighbours agree with them (the
// 2 x 2 mesh case), and after an option edit between steps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dion/comm/chunks.h"
#include "dion/comm/group.h"
#include "dion/comm/mesh.h"
#include "dion/dion.h"
#include "dion/optim/distributed.h"
#include "multiprocess.h"

namespace {

using dion::Distributed;
using dion::comm::Group;
using dion::testing::Child;
using dion::testing::expect_all_ok;
using dion::testing::make_problem;
using dion::testing::Problem;

// Run `body`; it must throw dion::ValueError whose message contains every one of `needles`.
void expect_disagreement(Child& c, const std::string& what, const std::function<void()>& body,
                         const std::vector<std::string>& needles) {
  try {
    body();
  } catch (const dion::ValueError& e) {
    const std::string msg = e.what();
    std::printf("[rank %d] %s: ValueError: %s\n", c.world.rank(), what.c_str(), msg.c_str());
    for (const auto& n : needles)
      if (msg.find(n) == std::string::npos) c.fail(what + ": the message does not mention '" + n + "'");
    return;
  }
  c.fail(what + ": no ValueError");
}

// Every parameter of `prob` row-sharded over `group`; `opts_of(rank)` gives this rank's options.
struct Sharded {
  std::vector<at::Tensor> params;
  std::shared_ptr<Distributed> dist;
};
Sharded shard_all(const Problem& prob, const std::shared_ptr<Group>& group) {
  Sharded s;
  s.dist = std::make_shared<Distributed>(group);
  for (const auto& full : prob.params) {
    s.params.push_back(dion::comm::shard_tensor(full, 0, group->size(), group->rank()));
    s.dist->shard(s.params.back(), full.sizes().vec(), 0);
  }
  return s;
}
void set_grads(const Problem& prob, Sharded& s, int step, const std::shared_ptr<Group>& group) {
  for (size_t i = 0; i < s.params.size(); ++i)
    s.params[i].mutable_grad() = dion::comm::shard_tensor(prob.grads[step][i], 0, group->size(), group->rank());
}

// Dion2 FSDP, fraction 0.25 on rank 0 and 1.0 on the others.
void scenario_fraction(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  Problem prob = make_problem({{32, 64}, {24, 48}}, 1, 1);
  Sharded s = shard_all(prob, group);
  const double fraction = group->rank() == 0 ? 0.25 : 1.0;
  dion::Dion2 opt({{s.params}}, dion::Dion2::defaults().fraction(fraction), {}, s.dist);
  set_grads(prob, s, 0, group);
  expect_disagreement(c, "fraction 0.25 vs 1", [&] { opt.step(); },
                      {"param group 0, parameter 0", "fraction is", "0.25", "1 on rank"});
}

// DDP Muon: rank 0 holds 5 parameters, the others the first 3 of them.
void scenario_count(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  Problem prob = make_problem({{16, 32}, {16, 32}, {16, 32}, {16, 32}, {16, 32}}, 1, 2);
  const size_t n = group->rank() == 0 ? 5 : 3;
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < n; ++i) {
    params.push_back(prob.params[i].clone());
    params.back().mutable_grad() = prob.grads[0][i].clone();
  }
  dion::Muon opt({{params}}, dion::Muon::defaults(), {}, std::make_shared<Distributed>(group));
  expect_disagreement(c, "5 vs 3 parameters", [&] { opt.step(); },
                      {"param group 0 has", "parameters 3..4 of group 0 exist on one rank only"});
}

// Options that change communication, one at a time, on the last rank only: selection_scope,
// the algorithm, num_heads, split_sizes. Each is detected before any algorithm collective.
void scenario_options(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  const bool odd = group->rank() == group->size() - 1;
  Problem prob = make_problem({{32, 64}, {32, 64}}, 1, 3);
  struct Case {
    std::string name;
    dion::Options mine;
    std::vector<std::string> needles;
  };
  const dion::Options base = dion::Options(0.01).algorithm("dion2");
  std::vector<Case> cases = {
      {"selection_scope",
       odd ? dion::Options(base).selection_scope("global") : base,
       {"parameter 0", "selection_scope is"}},
      {"algorithm", odd ? dion::Options(base).algorithm("nordion2") : base, {"algorithm is", "'dion2'", "'nordion2'"}},
      {"num_heads",
       odd ? dion::Options(base).algorithm("muon").num_heads(8) : dion::Options(base).algorithm("muon"),
       {"num_heads is"}},
      {"split_sizes",
       odd ? dion::Options(base).algorithm("muon").split_sizes({16, 16}) : dion::Options(base).algorithm("muon"),
       {"split_sizes is", "[16, 16]", "[]"}},
  };
  for (const Case& k : cases) {
    Sharded s = shard_all(prob, group);
    dion::Optimizer opt(s.params, k.mine, {}, s.dist);
    set_grads(prob, s, 0, group);
    expect_disagreement(
        c, k.name, [&] { opt.step(); }, k.needles);
  }
  // A global shape that differs (the shard specs are each valid on their own rank).
  {
    auto dist = std::make_shared<Distributed>(group);
    const std::vector<int64_t> shape = odd ? std::vector<int64_t>{32, 48} : std::vector<int64_t>{32, 64};
    at::Tensor local = dion::comm::shard_tensor(at::randn(shape), 0, group->size(), group->rank());
    dist->shard(local, shape, 0);
    dion::Optimizer opt({local}, base, {}, dist);
    local.mutable_grad() = at::randn_like(local);
    expect_disagreement(c, "global shape", [&] { opt.step(); }, {"global shape is", "[32, 64]", "[32, 48]"});
  }
}

// Agreement first, then an edit on one rank between steps (and an add_param_group on one rank):
// the next step raises on every rank; without edits a step runs normally.
void scenario_edit(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  Problem prob = make_problem({{32, 64}, {32, 64}}, 3, 4);
  Sharded s = shard_all(prob, group);
  dion::Dion2 opt({{s.params}}, dion::Dion2::defaults().fraction(0.5), {}, s.dist);
  set_grads(prob, s, 0, group);
  opt.step();  // agreed
  set_grads(prob, s, 1, group);
  opt.step();  // unchanged: no error
  if (group->rank() == 0) opt.options(0).fraction(0.75);
  set_grads(prob, s, 2, group);
  expect_disagreement(c, "fraction edited on rank 0", [&] { opt.step(); }, {"fraction is", "0.75", "0.5"});
  if (group->rank() == 0) opt.options(0).fraction(0.5);  // back in agreement
  opt.step();
  at::Tensor extra = at::randn({8});
  extra.mutable_grad() = at::randn({8});
  if (group->rank() == 0) opt.add_param_group({{extra}, {.algorithm = "adamw"}});
  expect_disagreement(c, "add_param_group on rank 0", [&] { opt.step(); },
                      {"the number of param groups is", "2 on rank", "1 on rank"});
}

// 2 x 2 mesh (FSDP x TP): only one rank differs; the two ranks that share no axis group with a
// disagreeing pair still raise (the report travels over both axes).
void scenario_mesh(Child& c) {
  dion::comm::DeviceMesh mesh(c.world, {{"fs", 2}, {"tp", 2}});
  auto fs = mesh.axis("fs"), tp = mesh.axis("tp");
  Problem prob = make_problem({{16, 32}, {20, 24}}, 1, 5);
  auto dist = std::make_shared<Distributed>(fs, tp);
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < prob.params.size(); ++i) {
    at::Tensor local = dion::comm::shard_tensor(dion::comm::shard_tensor(prob.params[i], 0, fs->size(), fs->rank()), 1,
                                                tp->size(), tp->rank());
    dist->shard(local, prob.params[i].sizes().vec(), 0, 1);
    local.mutable_grad() = at::randn_like(local);
    params.push_back(local);
  }
  const double fraction = c.world.rank() == 3 ? 0.5 : 0.25;
  dion::Dion2 opt({{params}}, dion::Dion2::defaults().fraction(fraction), {}, dist);
  expect_disagreement(c, "2 x 2 mesh, rank 3 differs", [&] { opt.step(); }, {"fraction is", "0.5", "0.25"});
}

TEST(Agreement, FractionDiffersTwoRanks) { expect_all_ok("fraction", 2); }
TEST(Agreement, ParameterCountDiffersTwoRanks) { expect_all_ok("count", 2); }
TEST(Agreement, CommunicationOptionsDifferThreeRanks) { expect_all_ok("options", 3); }
TEST(Agreement, EditsAndAddedGroupsAreCheckedAgain) { expect_all_ok("edit", 2); }
TEST(Agreement, OneRankOfA2x2MeshDiffers) { expect_all_ok("mesh", 4); }

}  // namespace

int main(int argc, char** argv) {
  return dion::testing::multiprocess_main(argc, argv,
                                          {{"fraction", scenario_fraction},
                                           {"count", scenario_count},
                                           {"options", scenario_options},
                                           {"edit", scenario_edit},
                                           {"mesh", scenario_mesh}});
}
