// Multi-process checkpoint tests: sharded optimizers save and load their own state.
//
// Bug pinned: a sharded legacy-Dion optimizer could not load its own checkpoint — the load
// check of Q used the unsharded shape rule (2 ranks, rows sharded: "'Q' has shape [16, 8],
// expected [8, r]"), and no test loaded a sharded checkpoint. Each scenario steps an optimizer,
// saves it, loads the archive into a fresh optimizer over copies of the same shards, steps both
// with the same gradients and requires identical parameters: tolerance 0, because both run the
// same kernels on the same data and the random sketches are reseeded identically before each
// step.
//
// Resharding (SavedAtTwoRanksLoadsAtOneAndFour): optimizer state saved by 2 FSDP ranks (each
// rank its own archive: every tensor with its global shape and that rank's offsets) is loaded
// by 1 process (no Distribution), by 4 FSDP ranks and by a 2 x 2 FSDP x TP mesh, which then take
// the next step; the result must equal the uninterrupted single-process run of the same steps.
// Tolerance 1e-5 relative, the FSDP tolerance of test_dist: the sharded steps assemble matrices
// with zero padding rows and sum norms over shards, and legacy Dion's randomized QR draws other
// sketches per rank (column signs and rounding of P only). Also: loading a subset of the
// archives at 4 ranks is refused and leaves the optimizer exactly as it was.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <unistd.h>
#include <torch/serialize/archive.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
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
  std::optional<dion::comm::DeviceMesh> mesh;
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
    at::Tensor t = dion::comm::shard_tensor(full, 0, outer->size(), outer->rank());
    return inner ? dion::comm::shard_tensor(t, 1, inner->size(), inner->rank()) : t;
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
    c.compare(std::string(tp ? "fsdp x tp" : "fsdp") + " dion resumed p" + std::to_string(i), b_params[i], a_params[i],
              0.0);
}

void scenario_dion_fsdp(Child& c) { dion_round_trip(c, false); }
void scenario_dion_fsdp_tp(Child& c) { dion_round_trip(c, true); }

// ---------------------------------------------------------------------------- resharding

// Groups of every algorithm with state, over these shapes (full shapes; params are sharded on
// dim 0, and on dim 1 over "tp" in the 2 x 2 layout; the AdamW vector is replicated).
// (Dion2 wide: under FSDP x TP it selects along the FSDP-sharded rows, which equals one process
// only where rows are the shorter dim; docs/distributed.md.)
const std::vector<std::vector<int64_t>> kReshardShapes = {{32, 64}, {24, 40}, {24, 48}, {18, 30}, {16, 48}, {40}};

std::vector<dion::ParamGroup> reshard_groups(const std::vector<at::Tensor>& p) {
  return {{{p[0]}, {.algorithm = "muon"}},
          {{p[1]}, {.algorithm = "normuon"}},
          {{p[2]}, {.algorithm = "dion2", .fraction = 0.5, .selection_scope = "global"}},
          {{p[3]}, {.algorithm = "nordion2", .fraction = 0.5, .selection_scope = "global"}},
          {{p[4]}, {.algorithm = "dion", .rank_fraction = 0.5}},
          {{p[5]}, {.algorithm = "adamw"}}};
}

std::string checkpoint_dir() {
  const char* dir = std::getenv("DION_TEST_CHECKPOINT_DIR");
  if (!dir) throw std::runtime_error("DION_TEST_CHECKPOINT_DIR is not set (the parent test sets it)");
  return dir;
}

// One layout: how to cut a full tensor into this rank's part and put it back together.
struct Placement {
  std::shared_ptr<Distributed> dist;  // null: one process
  std::shared_ptr<Group> outer, inner;
  std::optional<dion::comm::DeviceMesh> mesh;
  at::Tensor local(const at::Tensor& full) const {
    if (!outer || full.dim() < 2) return full.clone();
    at::Tensor t = dion::comm::shard_tensor(full, 0, outer->size(), outer->rank());
    return inner ? dion::comm::shard_tensor(t, 1, inner->size(), inner->rank()) : t;
  }
  at::Tensor gather(const at::Tensor& local, const at::Tensor& like) const {
    if (!outer || like.dim() < 2) return local;
    at::Tensor t = local.contiguous();
    if (inner) t = dion::comm::gather_tensor(*inner, t, 1, like.size(1));
    return dion::comm::gather_tensor(*outer, t, 0, like.size(0));
  }
};

Placement place(Child& c, const std::string& kind) {
  Placement pl;
  if (kind == "single") return pl;
  if (kind == "fsdp_tp") {
    pl.mesh.emplace(c.world, std::vector<std::pair<std::string, int>>{{"fs", 2}, {"tp", 2}});
    pl.outer = pl.mesh->axis("fs");
    pl.inner = pl.mesh->axis("tp");
    pl.dist = std::make_shared<Distributed>(pl.outer, pl.inner);
  } else {
    pl.outer = std::make_shared<Group>(c.world);
    pl.dist = std::make_shared<Distributed>(pl.outer);
  }
  return pl;
}

std::vector<at::Tensor> local_params(const Placement& pl, const std::vector<at::Tensor>& full) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& f : full) {
    out.push_back(pl.local(f));
    if (pl.dist && f.dim() >= 2) pl.dist->shard(out.back(), f.sizes().vec(), 0, pl.inner ? 1 : -1);
  }
  return out;
}

void take_step(dion::Optimizer& opt, const Placement& pl, std::vector<at::Tensor>& params, const Problem& prob, int t) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = pl.local(prob.grads[t][i]);
  at::manual_seed(200 + t);
  opt.step();
}

// The uninterrupted run: one process, all 3 steps.
std::vector<at::Tensor> uninterrupted(const Problem& prob) {
  Placement none;
  std::vector<at::Tensor> params;
  for (const at::Tensor& f : prob.params) params.push_back(f.clone());
  at::manual_seed(9);
  dion::Optimizer opt(reshard_groups(params), dion::Options(0.02));
  opt.init_state();
  for (int t = 0; t < 3; ++t) take_step(opt, none, params, prob, t);
  return params;
}

// 2 FSDP ranks: steps 0 and 1, then each rank saves its archive; rank 0 also the full params.
void scenario_reshard_save(Child& c) {
  Problem prob = make_problem(kReshardShapes, 3, 71);
  Placement pl = place(c, "fsdp");
  std::vector<at::Tensor> params = local_params(pl, prob.params);
  at::manual_seed(9);
  dion::Optimizer opt(reshard_groups(params), dion::Options(0.02), {}, pl.dist);
  opt.init_state();
  for (int t = 0; t < 2; ++t) take_step(opt, pl, params, prob, t);
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(checkpoint_dir() + "/optimizer.rank" + std::to_string(c.world.rank()) + ".pt");
  std::vector<at::Tensor> full;
  for (size_t i = 0; i < params.size(); ++i) full.push_back(pl.gather(params[i], prob.params[i]));
  if (c.world.rank() == 0) torch::save(full, checkpoint_dir() + "/params.pt");
}

std::vector<torch::serialize::InputArchive> read_archives(int count) {
  std::vector<torch::serialize::InputArchive> archives(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r)
    archives[static_cast<size_t>(r)].load_from(checkpoint_dir() + "/optimizer.rank" + std::to_string(r) + ".pt");
  return archives;
}

// Load at this run's layout, take step 2, compare with the uninterrupted run.
void reshard_load(Child& c, const std::string& kind) {
  Problem prob = make_problem(kReshardShapes, 3, 71);
  const std::vector<at::Tensor> expected = uninterrupted(prob);
  std::vector<at::Tensor> saved_full;
  torch::load(saved_full, checkpoint_dir() + "/params.pt");
  Placement pl = place(c, kind);
  std::vector<at::Tensor> params = local_params(pl, saved_full);
  dion::Optimizer opt(reshard_groups(params), dion::Options(0.02), {}, pl.dist);
  if (kind != "single") {
    // Only saved rank 0's archive: it holds the first half (ceil) of every sharded tensor's
    // rows, so ranks 2 and 3 (rows in the second half, in both 4-rank layouts) must refuse, and
    // every rank that refuses must stay exactly as it was (no state, step counts 0). Ranks 0 and
    // 1 find most of their slices in it (not all: 18 rows are chunked 9 + 9 at 2 ranks but
    // 5 + 5 + 5 + 3 at 4, so 4-rank rank 1's row 9 is in saved rank 1's archive).
    auto half = read_archives(1);
    const bool must_refuse = c.world.rank() >= 2;
    try {
      opt.load(half);
      if (must_refuse) c.fail(kind + ": loading 1 of the 2 archives was accepted");
    } catch (const dion::ValueError& e) {
      std::printf("[rank %d] %s, 1 of 2 archives: ValueError: %.240s\n", c.world.rank(), kind.c_str(), e.what());
      if (std::string(e.what()).find("cover only part") == std::string::npos) c.fail("unexpected message");
      for (size_t g = 0; g < params.size(); ++g) {
        if (opt.state_of(params[g]) != nullptr) c.fail("a refused load left state behind");
        if (opt.options(g).step() != 0) c.fail("a refused load changed the step count");
      }
    }
  }
  auto archives = read_archives(2);
  opt.load(archives);
  for (size_t g = 0; g < params.size(); ++g)
    if (opt.options(g).step() != 2) c.fail("group " + std::to_string(g) + ": step count not restored");
  take_step(opt, pl, params, prob, 2);
  for (size_t i = 0; i < params.size(); ++i)
    c.compare(kind + " resumed from 2 ranks, p" + std::to_string(i), pl.gather(params[i], prob.params[i]), expected[i],
              1e-5);
}

void scenario_reshard_load_single(Child& c) { reshard_load(c, "single"); }
void scenario_reshard_load_fsdp(Child& c) { reshard_load(c, "fsdp"); }
void scenario_reshard_load_fsdp_tp(Child& c) { reshard_load(c, "fsdp_tp"); }

TEST(ShardedCheckpoint, SavedAtTwoRanksLoadsAtOneAndFour) {
  char tmpl[] = "/tmp/dion_ckpt_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  ::setenv("DION_TEST_CHECKPOINT_DIR", tmpl, 1);  // the children inherit it
  expect_all_ok("reshard_save", 2);
  expect_all_ok("reshard_load_single", 1);
  expect_all_ok("reshard_load_fsdp", 4);
  expect_all_ok("reshard_load_fsdp_tp", 4);
  // (Not std::filesystem::remove_all: libtorch.so exports a copy of it that crashes here.)
  for (const char* f : {"/optimizer.rank0.pt", "/optimizer.rank1.pt", "/params.pt"})
    ::unlink((std::string(tmpl) + f).c_str());
  ::rmdir(tmpl);
}

TEST(ShardedCheckpoint, DionFsdpTwoRanksLoadsItsOwnCheckpoint) { expect_all_ok("dion_fsdp", 2); }
TEST(ShardedCheckpoint, DionFsdpUnevenFourRanksLoadsItsOwnCheckpoint) { expect_all_ok("dion_fsdp", 4); }
TEST(ShardedCheckpoint, DionFsdpTimesTp2x2LoadsItsOwnCheckpoint) { expect_all_ok("dion_fsdp_tp", 4); }

}  // namespace

int main(int argc, char** argv) {
  return dion::testing::multiprocess_main(argc, argv,
                                          {{"dion_fsdp", scenario_dion_fsdp},
                                           {"dion_fsdp_tp", scenario_dion_fsdp_tp},
                                           {"reshard_save", scenario_reshard_save},
                                           {"reshard_load_single", scenario_reshard_load_single},
                                           {"reshard_load_fsdp", scenario_reshard_load_fsdp},
                                           {"reshard_load_fsdp_tp", scenario_reshard_load_fsdp_tp}});
}
