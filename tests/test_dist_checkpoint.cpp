// Multi-process checkpoint tests: sharded optimizers save and load their own state.
//
// Bug pinned: a sharded legacy-Dion optimizer could not load its own checkpoint — the load
// check of Q used the unsharded shape rule (2 ranks, rows sharded: "'Q' has shape [16, 8],
// expected [8, r]"), and no test loaded a sharded checkpoint. Each scenario steps an optimizer,
// saves it, loads the archive into a fresh optimizer over copies of the same shards, steps both
// with the same gradients and requires identical parameters: tolerance 0, because both run the
// same kernels on the same data and the random sketches are reseeded identically before each
// step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize/archive.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dion/dion.h"
#include "dion/dist/distributed.h"
#include "dion/dist/group.h"
#include "dion/dist/mesh.h"
#include "multiprocess.h"

namespace {

using dion::dist::Distributed;
using dion::dist::Group;
using dion::testing::Child;
using dion::testing::expect_all_ok;
using dion::testing::make_problem;
using dion::testing::Problem;

std::string save_to_string(const dion::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

void load_from_string(dion::Optimizer& opt, const std::string& bytes) {
  std::istringstream is(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(is);
  opt.load(archive);
}

// Legacy Dion on row shards (1-D FSDP over the world, or 2 x 2 FSDP x TP): save after one step,
// load into a fresh optimizer, and both take two more steps alike.
void dion_round_trip(Child& c, bool tp) {
  std::optional<dion::dist::DeviceMesh> mesh;
  std::shared_ptr<Group> outer, inner;
  if (tp) {
    mesh.emplace(c.world, std::vector<std::pair<std::string, int>>{{"fs", 2}, {"tp", 2}});
    outer = mesh->axis("fs");
    inner = mesh->axis("tp");
  } else {
    outer = std::make_shared<Group>(c.world);
  }
  Problem prob = make_problem({{32, 64}, {24, 40}, {18, 30}}, 3, 51);
  auto local_of = [&](const at::Tensor& full) {
    at::Tensor t = dion::dist::shard_tensor(full, 0, outer->size(), outer->rank());
    return inner ? dion::dist::shard_tensor(t, 1, inner->size(), inner->rank()) : t;
  };
  auto build = [&](std::vector<at::Tensor>& params) {
    auto dist = inner ? std::make_shared<Distributed>(outer, inner) : std::make_shared<Distributed>(outer);
    for (size_t i = 0; i < prob.params.size(); ++i) {
      params.push_back(local_of(prob.params[i]));
      dist->shard(params.back(), prob.params[i].sizes().vec(), 0, inner ? 1 : -1);
    }
    return std::make_unique<dion::Dion>(std::vector<dion::ParamGroup>{{params}},
                                        dion::Dion::defaults().lr(0.02).rank_fraction(0.5), dist);
  };
  auto step = [&](dion::Optimizer& opt, std::vector<at::Tensor>& params, int t) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = local_of(prob.grads[t][i]);
    at::manual_seed(100 + t);  // the randomized QR's sketches: the same draws for both runs
    opt.step();
  };
  std::vector<at::Tensor> a_params, b_params;
  at::manual_seed(7);
  auto a = build(a_params);
  a->init_state();
  step(*a, a_params, 0);
  const std::string saved = save_to_string(*a);
  for (const at::Tensor& p : a_params) b_params.push_back(p.detach().clone());
  auto b_dist = inner ? std::make_shared<Distributed>(outer, inner) : std::make_shared<Distributed>(outer);
  for (size_t i = 0; i < b_params.size(); ++i)
    b_dist->shard(b_params[i], prob.params[i].sizes().vec(), 0, inner ? 1 : -1);
  dion::Dion b({{b_params}}, dion::Dion::defaults().lr(0.02).rank_fraction(0.5), b_dist);
  load_from_string(b, saved);
  for (size_t i = 0; i < a_params.size(); ++i)
    c.compare("loaded Q p" + std::to_string(i), b.state_of(b_params[i])->Q(), a->state_of(a_params[i])->Q(), 0.0);
  for (int t = 1; t < 3; ++t) {
    step(*a, a_params, t);
    step(b, b_params, t);
  }
  for (size_t i = 0; i < a_params.size(); ++i)
    c.compare(std::string(tp ? "fsdp x tp" : "fsdp") + " dion resumed p" + std::to_string(i), b_params[i],
              a_params[i], 0.0);
}

void scenario_dion_fsdp(Child& c) { dion_round_trip(c, false); }
void scenario_dion_fsdp_tp(Child& c) { dion_round_trip(c, true); }

TEST(ShardedCheckpoint, DionFsdpTwoRanksLoadsItsOwnCheckpoint) { expect_all_ok("dion_fsdp", 2); }
TEST(ShardedCheckpoint, DionFsdpUnevenFourRanksLoadsItsOwnCheckpoint) { expect_all_ok("dion_fsdp", 4); }
TEST(ShardedCheckpoint, DionFsdpTimesTp2x2LoadsItsOwnCheckpoint) { expect_all_ok("dion_fsdp_tp", 4); }

}  // namespace

int main(int argc, char** argv) {
  return dion::testing::multiprocess_main(argc, argv,
                                          {{"dion_fsdp", scenario_dion_fsdp}, {"dion_fsdp_tp", scenario_dion_fsdp_tp}});
}
