// Multi-process tests of the distributed step: Gloo over loopback, N real processes.
//
// Each TEST launches N copies of this binary (`--child SCENARIO`) with torchrun's variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and waits for them, killing all after a
// deadline (tests/support/multiprocess.h). Every child builds the same full parameters and gradients from a seed, computes the
// single-process result itself (dion::Optimizer without a Distribution), runs the distributed
// optimizer on its shard or replica, gathers the parameters back and compares. A child prints
// what it compared and exits 0 when everything matched.
//
// Tolerances (relative to the largest expected magnitude):
//   - DDP: 0. Each matrix goes through the same kernels as in the single-process megabatch.
//   - FSDP: 1e-5. The assembled matrix is the single-process one plus zero padding rows; BLAS
//     may block the padded product differently, which moves the bf16 orthogonalization by at
//     most an ulp in rare elements; the parameter moves by lr * that (observed values are printed).
//   - NorMuon / NorDion2 row-sharded: also 1e-5: the Frobenius norms are summed over shards
//     instead of computed whole (different summation order, float32).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <dirent.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "dion/comm/chunks.h"
#include "dion/comm/group.h"
#include "dion/comm/mesh.h"
#include "cpu_kind.h"
#include "dion/dion.h"
#include "dion/math/dion.h"
#include "dion/optim/distributed.h"
#include "multiprocess.h"
#include "threads.h"

namespace {

// One process and the ranks' shares run bf16 GEMMs over other batch sizes: oneDNN off, so that
// both run ATen's gemm per matrix and compare at tolerance 0 (tests/support/cpu_kind.h).
[[maybe_unused]] const bool kBatchInvariantGemms = dion::testing::pin_batch_invariant_bf16_gemms();

using dion::Distributed;
using dion::comm::Group;

using dion::testing::Child;
using dion::testing::expect_all_ok;
using dion::testing::launch;
using dion::testing::make_problem;
using dion::testing::Problem;
using dion::testing::RunResult;

// ---------------------------------------------------------------------------- scenarios (child)

dion::Options options_for(const std::string& algo) {
  return dion::Options(0.02).algorithm(algo).weight_decay(0.01).fraction(0.5);
}

// Run `steps` steps on copies of the params; `setup` turns each full param into this rank's
// local tensor and may register it with the distribution.
std::vector<at::Tensor> run(const Problem& prob, const dion::Options& opts, const std::shared_ptr<Distributed>& dist,
                            const std::function<at::Tensor(const at::Tensor&, size_t)>& local_of) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < prob.params.size(); ++i) params.push_back(local_of(prob.params[i], i));
  dion::Optimizer opt(params, opts);
  opt.init_state();  // legacy Dion: draw every Q before any sketch, as the distributed runs do
  if (dist) opt.set_distribution(dist);
  for (const auto& gs : prob.grads) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = local_of(gs[i], i);
    opt.step();
  }
  return params;
}

std::vector<at::Tensor> single(const Problem& prob, const dion::Options& opts) {
  return run(prob, opts, nullptr, [](const at::Tensor& t, size_t) { return t.clone(); });
}

const std::vector<std::string> kAlgorithms = {"muon", "normuon", "dion2", "nordion2"};

// DDP: every rank holds every parameter; megabatches split across ranks.
void scenario_ddp(Child& c) {
  Problem prob = make_problem({{16, 32}, {16, 32}, {16, 32}, {32, 16}, {24, 24}, {16, 32}}, 3, 7);
  auto group = std::make_shared<Group>(c.world);
  for (const auto& algo : kAlgorithms) {
    auto expected = single(prob, options_for(algo));
    auto dist = std::make_shared<Distributed>(group);
    group->stats().clear();
    auto got = run(prob, options_for(algo), dist, [](const at::Tensor& t, size_t) { return t.clone(); });
    for (size_t i = 0; i < got.size(); ++i) c.compare(algo + " ddp p" + std::to_string(i), got[i], expected[i], 0.0);
    if (group->stats().calls("all_gather") == 0) {
      std::printf("[rank %d] %s ddp: no all_gather was issued\n", c.world.rank(), algo.c_str());
      ++c.failures;
    }
  }
}

// FSDP: every parameter sharded along `dim` (uneven and empty shards included by the shapes).
// Every parameter of `prob` sharded along `dim` over `group` (FSDP2 chunks), the optimizer built
// with the Distribution (so shape checks see global shapes), and all of prob's steps taken on the
// shards. `before_steps` runs once, after construction (e.g. to clear the byte counters).
std::vector<at::Tensor> run_sharded(const Problem& prob, const dion::Options& opts, const std::shared_ptr<Group>& group,
                                    int64_t dim, const std::function<void()>& before_steps = nullptr) {
  const int W = group->size(), r = group->rank();
  auto dist = std::make_shared<Distributed>(group);
  std::vector<at::Tensor> params;
  for (const auto& full : prob.params) {
    params.push_back(dion::comm::shard_tensor(full, dim, W, r));
    dist->shard(params.back(), full.sizes().vec(), dim);
  }
  dion::Optimizer opt(params, opts, {}, dist);
  if (before_steps) before_steps();
  for (const auto& gs : prob.grads) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = dion::comm::shard_tensor(gs[i], dim, W, r);
    opt.step();
  }
  return params;
}

void fsdp_case(Child& c, const std::vector<std::vector<int64_t>>& shapes, int64_t dim,
               const std::vector<std::string>& algos, const std::string& scope, double tol) {
  Problem prob = make_problem(shapes, 3, 11);
  auto group = std::make_shared<Group>(c.world);
  for (const auto& algo : algos) {
    dion::Options opts = options_for(algo).selection_scope(scope);
    if (scope == "local") opts.fraction(1.0);  // local selection equals whole-matrix selection at 1
    auto expected = single(prob, opts);
    auto params = run_sharded(prob, opts, group, dim);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor full = dion::comm::gather_tensor(*group, params[i], dim, prob.params[i].size(dim));
      c.compare(algo + " fsdp dim" + std::to_string(dim) + " " + scope + " p" + std::to_string(i), full, expected[i],
                tol);
    }
  }
}

void scenario_fsdp_rows(Child& c) {
  // 18 rows over 4 ranks: 5,5,5,3; 3 rows over 4 ranks: 1,1,1,0 (an empty shard). Wide
  // matrices: Dion2 selects along the sharded dim, which single-process Dion2 picks only when it
  // is the shorter one.
  fsdp_case(c, {{16, 32}, {16, 32}, {24, 32}, {18, 24}, {3, 16}}, 0, kAlgorithms, "global", 1e-5);
  fsdp_case(c, {{16, 32}, {24, 32}, {18, 24}}, 0, kAlgorithms, "local", 1e-5);
}

void scenario_fsdp_cols(Child& c) {
  // Tall matrices (the sharded dim is the shorter one). NorMuon / NorDion2: each rank holds part
  // of every row; the per-neuron sums of U^2 are summed over the shards (they were refused).
  fsdp_case(c, {{32, 16}, {32, 16}, {24, 18}, {40, 6}}, 1, kAlgorithms, "global", 1e-5);
}

// Dion2 / NorDion2 under FSDP equal one process for every shape. The bug this pins: on tall
// row-sharded matrices (384 x 128, 512 x 128) Dion2 selected along the sharded dim 0 while one
// process selects along the shorter dim 1, and the first update differed by more than 100%
// (either selection scope). Now Dion2 selects along the shorter dim (selection_dim "shorter"):
// column L1 norms are summed across the shards, each shard keeps its rows of the selected
// columns. Equal to one process: the global scope for every shape and both algorithms, and the
// local scope wherever the selection runs across the shards (tall row-sharded, wide column-
// sharded). Tolerances:
//   - selection across the shards (Dion2 tall row-sharded): 0 (the summed partial norms only
//     choose the slices); wide column-sharded: 1e-5 as for FSDP above, observed 0.
//   - selection along the sharded dim (Dion2 wide row-sharded / tall column-sharded): 0, bit for
//     bit. The assembly hands the orthogonalizer exactly one process's k slices in one process's
//     top-k order (top_k_over_shards' `order`). Before, the slices arrived rank-major and
//     zero-padded: a row permutation, which moved a bf16 orthogonalization by up to 4.8e-2 of the
//     largest update element on an AVX2-only CPU (2.7e-4 on an AVX-512 one).
//   - NorDion2 along the sharded rows: 1e-5 (its Frobenius norms are summed over the shards).
// selection_dim "shard" keeps the reference's behaviour (select along the sharded dim); on a
// tall row-sharded matrix it must differ from one process (checked to be more than 1e-2 off).
void scenario_fsdp_every_shape(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  const std::vector<std::vector<int64_t>> tall = {{384, 128}, {512, 128}, {40, 24}, {40, 24}},
                                          wide = {{128, 384}, {24, 40}, {18, 30}};
  auto check = [&](const std::string& what, const std::vector<std::vector<int64_t>>& shapes, int64_t dim,
                   const dion::Options& opts, double tol, bool expect_equal = true) {
    Problem prob = make_problem(shapes, 2, 61);
    auto expected = single(prob, opts);
    auto params = run_sharded(prob, opts, group, dim);
    double worst = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor full = dion::comm::gather_tensor(*group, params[i], dim, prob.params[i].size(dim));
      if (expect_equal) {
        c.compare(what + " p" + std::to_string(i), full, expected[i], tol);
      } else {
        // Compare the updates (param - initial), not the params, to see the selection differ.
        at::Tensor du = full - prob.params[i], de = expected[i] - prob.params[i];
        worst = std::max(worst, (du - de).abs().max().item<double>() / de.abs().max().item<double>());
      }
    }
    if (!expect_equal) {
      if (c.world.rank() == 0)
        std::printf("[rank 0] %s: update differs from one process by %.3g\n", what.c_str(), worst);
      if (worst <= 1e-2) c.fail(what + ": selection_dim 'shard' should differ from one process on tall shards");
    }
  };
  for (const char* algo : {"dion2", "nordion2"})
    for (const char* scope : {"global", "local"}) {
      dion::Options opts = options_for(algo).fraction(0.25).selection_scope(scope);
      // NorDion2 selects rows, as one process does; the local scope is per-shard top-k along
      // the sharded rows, which equals one process only at fraction 1.
      if (std::string(algo) == "nordion2" && std::string(scope) == "local") opts.fraction(1.0);
      const bool dion2 = std::string(algo) == "dion2";  // tall rows: select columns, across the shards
      const double along = dion2 ? 0.0 : 1e-5;
      check(std::string(algo) + " " + scope + " tall rows", tall, 0, opts, along);
      check(std::string(algo) + " " + scope + " wide rows", wide, 0,
            std::string(scope) == "local" ? dion::Options(opts).fraction(1.0) : opts, along);
    }
  for (const char* scope : {"global", "local"}) {
    dion::Options opts = options_for("dion2").fraction(0.25).selection_scope(scope);
    check(std::string("dion2 ") + scope + " wide cols", wide, 1, opts, 1e-5);
    check(std::string("dion2 ") + scope + " tall cols", tall, 1,
          std::string(scope) == "local" ? dion::Options(opts).fraction(1.0) : opts, 0.0);
  }
  // The regression this pins (measured on an AVX2-only CPU): mixed shapes in one optimizer, the
  // wide ones row-sharded, at fractions 1 and 0.5, both scopes where they select every slice.
  const std::vector<std::vector<int64_t>> mixed = {{384, 128}, {512, 128}, {128, 128}, {128, 512}};
  for (double fraction : {1.0, 0.5})
    for (const char* scope : {"global", "local"}) {
      if (fraction < 1 && std::string(scope) == "local") continue;  // per-shard top-k: by design not one process's
      dion::Options opts = options_for("dion2").fraction(fraction).selection_scope(scope);
      check("dion2 " + std::string(scope) + " fraction " + std::to_string(fraction) + " mixed rows", mixed, 0, opts,
            0.0);
    }
  check("dion2 selection_dim shard, tall rows", tall, 0,
        options_for("dion2").fraction(0.25).selection_scope("global").selection_dim("shard"), 0, false);
}

// Dion2 / NorDion2 equal one process on the layouts that used to select along the FSDP-sharded
// dim: 2-D (FSDP x TP) sharding of tall matrices (one process selects columns: the inner-sharded
// dim; column L1 norms summed over "fs", the top-k taken over the "tp" shards' norms), and 3-D
// parameters sharded on a matrix dim (tall row-sharded: column norms summed over the shards, as
// for 2-D). Tolerances: Dion2 0 (the orthogonalizer sees one process's slices in one process's
// order; the L1 norms summed over the other axis only choose them), NorDion2 / NorMuon 1e-5
// (their norms are summed over the shards), 3-D across the shards 1e-5.
void scenario_every_layout(Child& c) {
  dion::comm::DeviceMesh mesh(c.world, {{"fs", 2}, {"tp", 2}});
  auto fs = mesh.axis("fs"), tp = mesh.axis("tp");
  const std::vector<std::vector<int64_t>> tall = {{384, 128}, {40, 24}, {40, 24}}, wide = {{24, 40}, {128, 384}};
  auto local_2d = [&](const at::Tensor& full, int64_t outer_dim) {
    return dion::comm::shard_tensor(dion::comm::shard_tensor(full, outer_dim, fs->size(), fs->rank()), 1 - outer_dim,
                                    tp->size(), tp->rank());
  };
  auto run_2d = [&](const std::string& what, const std::vector<std::vector<int64_t>>& shapes, int64_t outer_dim,
                    const dion::Options& opts, double tol, bool expect_equal = true) {
    Problem prob = make_problem(shapes, 2, 67);
    auto expected = single(prob, opts);
    auto dist = std::make_shared<Distributed>(fs, tp);
    std::vector<at::Tensor> params;
    for (const auto& full : prob.params) {
      params.push_back(local_2d(full, outer_dim));
      dist->shard(params.back(), full.sizes().vec(), outer_dim, 1 - outer_dim);
    }
    dion::Optimizer opt(params, opts, {}, dist);
    for (const auto& gs : prob.grads) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = local_2d(gs[i], outer_dim);
      opt.step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor part = dion::comm::gather_tensor(*tp, params[i], 1 - outer_dim, prob.params[i].size(1 - outer_dim));
      at::Tensor full = dion::comm::gather_tensor(*fs, part, outer_dim, prob.params[i].size(outer_dim));
      if (expect_equal) {
        c.compare(what + " p" + std::to_string(i), full, expected[i], tol);
        continue;
      }
      // The reference's selection (along the sharded dim): the update must differ from one process.
      at::Tensor du = full - prob.params[i], de = expected[i] - prob.params[i];
      const double off = (du - de).abs().max().item<double>() / de.abs().max().item<double>();
      if (c.world.rank() == 0)
        std::printf("[rank 0] %s p%zu: update differs from one process by %.3g\n", what.c_str(), i, off);
      if (i == 0 && off <= 1e-2)
        c.fail(what + ": selection_dim 'shard' should differ from one process on tall matrices");
    }
  };
  for (const char* scope : {"global", "local"}) {
    const dion::Options opts = options_for("dion2").fraction(0.25).selection_scope(scope);
    run_2d(std::string("dion2 fsdp x tp tall ") + scope, tall, 0, opts, 0.0);              // columns: along tp
    run_2d(std::string("dion2 fsdp x tp wide ") + scope, wide, 0, opts, 0.0);              // rows: along fs
    run_2d(std::string("dion2 fsdp(cols) x tp(rows) tall ") + scope, tall, 1, opts, 0.0);  // columns: along fs
    run_2d(std::string("dion2 fsdp(cols) x tp(rows) wide ") + scope, wide, 1, opts, 0.0);  // rows: along tp
  }
  run_2d("nordion2 fsdp x tp tall", tall, 0, options_for("nordion2").fraction(0.25), 1e-5);
  // The trainer's column-parallel layout (tp on rows, fs on columns): NorMuon's and NorDion2's
  // per-neuron sums over "fs"; NorDion2's rows selected over the "tp" shards' norms (rank-major).
  run_2d("normuon fsdp(cols) x tp(rows) wide", wide, 1, options_for("normuon"), 1e-5);
  run_2d("nordion2 fsdp(cols) x tp(rows) tall", tall, 1, options_for("nordion2").fraction(0.25), 1e-5);
  run_2d("dion2 fsdp x tp tall, selection_dim shard", tall, 0,
         options_for("dion2").fraction(0.25).selection_dim("shard"), 0, /*expect_equal=*/false);
  // 3-D parameters sharded on their rows over all 4 ranks (1-D): tall -> columns across shards.
  auto world = std::make_shared<Group>(c.world);
  for (const char* scope : {"global", "local"}) {
    const dion::Options opts = options_for("dion2").fraction(0.25).selection_scope(scope);
    Problem prob = make_problem({{3, 40, 24}, {2, 64, 16}}, 2, 71);
    auto expected = single(prob, opts);
    auto params = run_sharded(prob, opts, world, 1);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor full = dion::comm::gather_tensor(*world, params[i], 1, prob.params[i].size(1));
      c.compare(std::string("dion2 3-D tall rows ") + scope + " p" + std::to_string(i), full, expected[i], 1e-5);
    }
  }
  // 2-D sharding of a 3-D parameter: refused (NotImplementedError on every rank). The plans are
  // made before any task runs, so a healthy 2-D-sharded group stepped first (group 0, which would
  // issue its all_to_all) issues no collective, and no group's step count moves.
  {
    Problem prob = make_problem({{2, 16, 16}}, 1, 73);
    auto dist = std::make_shared<Distributed>(fs, tp);
    at::Tensor p =
        dion::comm::shard_tensor(dion::comm::shard_tensor(prob.params[0], 1, 2, fs->rank()), 2, 2, tp->rank());
    dist->shard(p, prob.params[0].sizes().vec(), 1, 2);
    const at::Tensor whole = at::randn({16, 16});
    at::Tensor q = dion::comm::shard_tensor(dion::comm::shard_tensor(whole, 0, 2, fs->rank()), 1, 2, tp->rank());
    dist->shard(q, {16, 16}, 0, 1);
    dion::Optimizer opt(std::vector<dion::ParamGroup>{{{q}}, {{p}}}, options_for("dion2"), {}, dist);
    p.mutable_grad() = at::ones_like(p);
    q.mutable_grad() = at::ones_like(q);
    opt.init_state();  // the step's own agreement collectives, before the counts are cleared
    fs->stats().clear();
    tp->stats().clear();
    try {
      opt.step();
      c.fail("dion2 with 2-D sharding of a 3-D parameter should raise NotImplementedError");
    } catch (const dion::NotImplementedError& e) {
      if (std::string(e.what()).find("2-D (FSDP x TP)") == std::string::npos)
        c.fail(std::string("message: ") + e.what());
      if (std::string(e.what()).find("param group 1 (dion2), shape [2, 16, 16]") == std::string::npos)
        c.fail(std::string("the message should name the group and the shape: ") + e.what());
    }
    for (const auto* g : {fs.get(), tp.get()})
      if (g->stats().calls("all_to_all") != 0 || g->stats().calls("all_gather") != 0)
        c.fail("a refused step issued a collective of group 0's task before the refusal");
    if (opt.options(0).step() != 0 || opt.options(1).step() != 0)
      c.fail("a refused step moved the groups' step counts");
  }
}

void scenario_batch_sharded(Child& c) {
  // 3-D params sharded on the batch dim: whole matrices on every rank, no communication.
  fsdp_case(c, {{4, 8, 16}, {4, 16, 8}}, 0, kAlgorithms, "global", 0.0);
}

// HSDP 2 x 2: shard over "fs", replicate over "dp"; gradients are identical across "dp".
void scenario_hsdp(Child& c) {
  dion::comm::DeviceMesh mesh(c.world, {{"dp", 2}, {"fs", 2}});
  auto fs = mesh.axis("fs");
  Problem prob = make_problem({{16, 32}, {16, 32}, {20, 24}}, 3, 5);
  for (const auto& algo : kAlgorithms) {
    dion::Options opts = options_for(algo).selection_scope("global");
    auto expected = single(prob, opts);
    auto params = run_sharded(prob, opts, fs, 0);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor full = dion::comm::gather_tensor(*fs, params[i], 0, prob.params[i].size(0));
      c.compare(algo + " hsdp dp" + std::to_string(mesh.coordinate("dp")) + " p" + std::to_string(i), full, expected[i],
                1e-5);
    }
  }
}

// 2-D sharding (FSDP x TP) on a 2 x 2 mesh: rows over "fs", columns over "tp". Past the
// reference (which has 2-D sharding for legacy Dion only): whole matrices are assembled in two
// all_to_all stages; NorMuon / NorDion2 sum their per-neuron statistics over "tp"; Dion2 /
// NorDion2 select exactly (partial L1 norms summed over "tp", gathered over "fs").
void scenario_tp(Child& c) {
  dion::comm::DeviceMesh mesh(c.world, {{"fs", 2}, {"tp", 2}});
  auto fs = mesh.axis("fs"), tp = mesh.axis("tp");
  Problem prob = make_problem({{16, 32}, {16, 32}, {20, 24}, {18, 30}}, 3, 13);
  auto local_of = [&](const at::Tensor& full) {
    return dion::comm::shard_tensor(dion::comm::shard_tensor(full, 0, fs->size(), fs->rank()), 1, tp->size(),
                                    tp->rank());
  };
  for (const auto& algo : kAlgorithms) {
    dion::Options opts = options_for(algo);
    auto expected = single(prob, opts);
    auto dist = std::make_shared<Distributed>(fs, tp);
    std::vector<at::Tensor> params;
    for (const auto& full : prob.params) {
      params.push_back(local_of(full));
      dist->shard(params.back(), full.sizes().vec(), 0, 1);
    }
    dion::Optimizer opt(params, opts);
    opt.set_distribution(dist);
    for (const auto& gs : prob.grads) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = local_of(gs[i]);
      opt.step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor rows = dion::comm::gather_tensor(*tp, params[i], 1, prob.params[i].size(1));
      at::Tensor full = dion::comm::gather_tensor(*fs, rows, 0, prob.params[i].size(0));
      c.compare(algo + " fsdp x tp p" + std::to_string(i), full, expected[i], 1e-5);
    }
  }
}

using dion::testing::thread_count;

// Overlap: 3 megabatch tasks in flight on one thread give bit-identical results to 1 (each task
// runs the same kernels; only the interleaving changes), start no thread and no process group
// (the thread count during and between steps stays what it was after the first step), and do
// interleave: when a step's first orthogonalization runs, a later task has already issued its
// all_to_all (2 calls seen instead of 1). Step times are printed, not asserted.
void scenario_overlap(Child& c) {
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < 6; ++i) shapes.push_back({128 + 16 * i, 256});  // 6 megabatches
  shapes.push_back({64});                                             // an adamw task
  Problem prob = make_problem(shapes, 4, 17);
  auto group = std::make_shared<Group>(c.world);
  const int W = group->size(), r = group->rank();
  for (const char* algo : {"muon", "nordion2"}) {
    std::vector<std::vector<at::Tensor>> results;
    for (int in_flight : {1, 3}) {
      auto dist = std::make_shared<Distributed>(group);
      dist->overlap(in_flight);
      std::vector<at::Tensor> params;
      for (size_t i = 0; i < prob.params.size(); ++i) {
        const at::Tensor& full = prob.params[i];
        if (full.dim() == 2) {
          params.push_back(dion::comm::shard_tensor(full, 0, W, r));
          dist->shard(params.back(), full.sizes().vec(), 0);
        } else {
          params.push_back(full.clone());
        }
      }
      // The default orthogonalizer, observed: threads and all_to_all calls so far, per call.
      std::vector<std::pair<int, int64_t>> seen;  // (threads, all_to_all calls)
      dion::math::OrthoConfig ortho;
      ortho.custom = [inner = dion::math::OrthoConfig{}.function(), &seen, &group](const at::Tensor& X, double eps) {
        seen.emplace_back(thread_count(), group->stats().calls("all_to_all"));
        return inner(X, eps);
      };
      std::vector<dion::ParamGroup> groups = {{{params.begin(), params.end() - 1}},
                                              {{params.back()}, {.algorithm = "adamw"}}};
      dion::Optimizer opt(groups, options_for(algo), ortho);
      opt.set_distribution(dist);
      double seconds = 0;
      int threads_after_first = 0;
      for (size_t t = 0; t < prob.grads.size(); ++t) {
        const auto& gs = prob.grads[t];
        for (size_t i = 0; i < params.size(); ++i)
          params[i].mutable_grad() = gs[i].dim() == 2 ? dion::comm::shard_tensor(gs[i], 0, W, r) : gs[i].clone();
        seen.clear();
        group->stats().clear();
        const auto t0 = std::chrono::steady_clock::now();
        opt.step();
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const int after = thread_count();
        if (t == 0) threads_after_first = after;
        if (t == 0 || seen.empty()) continue;
        // Steps 2..: no thread appears or disappears, during the step or across steps.
        int during_max = 0;
        for (const auto& [threads, calls] : seen) during_max = std::max(during_max, threads);
        if (after != threads_after_first || during_max != threads_after_first) {
          std::printf("[rank %d] %s, %d in flight, step %zu: %d threads after the first step, %d during, %d after\n", r,
                      algo, in_flight, t + 1, threads_after_first, during_max, after);
          ++c.failures;
        }
        const int64_t expected_calls = in_flight == 1 ? 1 : 2;
        if (seen.front().second != expected_calls) {
          std::printf(
              "[rank %d] %s, %d in flight: %lld all_to_all issued before the first orthogonalization, "
              "expected %lld\n",
              r, algo, in_flight, static_cast<long long>(seen.front().second), static_cast<long long>(expected_calls));
          ++c.failures;
        }
      }
      if (r == 0)
        std::printf("[rank 0] %s FSDP %d ranks, %d task(s) in flight: %.1f ms per step, %d threads\n", algo, W,
                    in_flight, 1e3 * seconds / static_cast<double>(prob.grads.size()), threads_after_first);
      results.push_back(params);
    }
    for (size_t i = 0; i < results[0].size(); ++i)
      c.compare(std::string(algo) + " 3 in flight vs 1, p" + std::to_string(i), results[1][i], results[0][i], 0.0);
  }
  // Legacy Dion (FSDP rows): its tasks draw random sketches, run serially in task order, so 3 in
  // flight equals 1 bit for bit too.
  Problem dion_prob = make_problem({{32, 64}, {32, 64}, {24, 40}, {18, 30}, {24, 40}}, 3, 23);
  std::vector<std::vector<at::Tensor>> dion_results;
  for (int in_flight : {1, 3}) {
    auto dist = std::make_shared<Distributed>(group);
    dist->overlap(in_flight);
    std::vector<at::Tensor> params;
    for (const auto& full : dion_prob.params) {
      params.push_back(dion::comm::shard_tensor(full, 0, W, r));
      dist->shard(params.back(), full.sizes().vec(), 0);
    }
    at::manual_seed(9);
    dion::Dion opt({{params}}, dion::Dion::defaults().lr(0.02), dist);
    opt.init_state();
    for (const auto& gs : dion_prob.grads) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = dion::comm::shard_tensor(gs[i], 0, W, r);
      opt.step();
    }
    dion_results.push_back(params);
  }
  for (size_t i = 0; i < dion_results[0].size(); ++i)
    c.compare("dion 3 in flight vs 1, p" + std::to_string(i), dion_results[1][i], dion_results[0][i], 0.0);
}

// Dion2 with fraction a moves about a of Muon's all_to_all bytes (local selection scope).
void scenario_bytes(Child& c) {
  Problem prob = make_problem({{64, 64}, {64, 64}, {64, 64}, {64, 64}}, 1, 3);
  auto group = std::make_shared<Group>(c.world);
  auto bytes_for = [&](const dion::Options& opts) {  // prob has one step: the counters hold it alone
    run_sharded(prob, opts, group, 0, [&] { group->stats().clear(); });
    return group->stats().bytes("all_to_all");
  };
  const double muon = static_cast<double>(bytes_for(options_for("muon")));
  for (double fraction : {0.25, 0.5}) {
    const double dion2 =
        static_cast<double>(bytes_for(options_for("dion2").fraction(fraction).selection_scope("local")));
    const double ratio = dion2 / muon;
    if (c.world.rank() == 0)
      std::printf("[rank 0] all_to_all bytes: muon %.0f, dion2(fraction %.2f) %.0f, ratio %.3f\n", muon, fraction,
                  dion2, ratio);
    if (std::abs(ratio - fraction) > 0.02) ++c.failures;
  }
}

// Legacy Dion, DDP. Every rank has its own gradient; with optimizer-side sync the result must
// equal a single process fed the mean gradient. rank_fraction 1: the gradient is averaged;
// rank_fraction 0.25: only P and R are (compressed sync, decoupled momenta). Each rank's
// randomized QR draws its own sketch, which changes P only by column signs and rounding (the
// update P Q^T is sign-invariant), hence the tolerance 1e-5 instead of 0.
void scenario_dion_ddp(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  const int W = group->size(), r = group->rank();
  const std::vector<std::vector<int64_t>> shapes = {{64, 32}, {64, 32}, {64, 32}, {32, 48}, {40, 40}};
  Problem prob = make_problem(shapes, 3, 21);
  // Per-rank gradients whose mean is prob.grads.
  auto rank_grad = [&](const at::Tensor& mean, int rank, int t, size_t i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 100 * t + 10 * i);
    std::vector<at::Tensor> noise;
    for (int w = 0; w < W; ++w) noise.push_back(at::randn(mean.sizes(), gen));
    at::Tensor centered = noise[rank] - at::stack(noise, 0).mean(0);
    return (mean + centered).contiguous();
  };
  for (double rank_fraction : {1.0, 0.25}) {
    dion::Options opts = dion::Dion::defaults().lr(0.02).rank_fraction(rank_fraction);
    std::vector<at::Tensor> expected;
    at::Tensor expected_momentum;
    {
      at::manual_seed(5);
      expected = single(prob, opts);
    }
    at::manual_seed(5);  // same initial Q on every rank
    std::vector<at::Tensor> params;
    for (const auto& full : prob.params) params.push_back(full.clone());
    dion::Dion opt({{params}}, opts);
    opt.init_state();
    auto dist = std::make_shared<Distributed>(group, /*sync_gradients=*/true);
    opt.set_distribution(dist);
    dist->prepare();  // the one-time shard-spec check (a 4-byte all_reduce), before counting
    group->stats().clear();
    for (int t = 0; t < static_cast<int>(prob.grads.size()); ++t) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = rank_grad(prob.grads[t][i], r, t, i);
      opt.step();
    }
    const int64_t reduced = group->stats().bytes("all_reduce");
    for (size_t i = 0; i < params.size(); ++i)
      c.compare("dion ddp rank_fraction " + std::to_string(rank_fraction).substr(0, 4) + " p" + std::to_string(i),
                params[i], expected[i], 1e-5);
    if (r == 0)
      std::printf("[rank 0] dion ddp rank_fraction %.2f: all_reduce bytes %lld\n", rank_fraction,
                  static_cast<long long>(reduced));
    // Compressed sync moves rank-proportional bytes: P [m', r] + R [n', r] instead of G [m, n].
    int64_t full = 0, compressed = 0;
    for (const auto& sh : shapes) {
      const int64_t m = sh[0], n = sh[1], k = dion::math::dion_rank(m, n, rank_fraction, 1);
      full += m * n * 4;
      compressed += ((m + n) * k < m * n && rank_fraction < 1.0) ? (m + n) * k * 4 : m * n * 4;
    }
    // Plus, each step, the 8-byte all_reduce of the cross-rank agreement check ("did any rank's
    // optimizer description change?", src/optim/agreement.h).
    compressed += 8;
    full += 8;
    if (reduced != 3 * compressed) {
      std::printf("[rank %d] all_reduce bytes %lld, expected %lld (full gradients: %lld)\n", r,
                  static_cast<long long>(reduced), static_cast<long long>(3 * compressed),
                  static_cast<long long>(3 * full));
      ++c.failures;
    }
  }
}

// Legacy Dion on shards (the reference's dion_update_fsdp / dion_update_fsdp_tp). Dion works on
// M^T exactly when the FSDP-sharded dim is dim 0, so the shapes are chosen to give the same
// orientation as the single process (wide for row sharding, tall for column sharding). The
// randomized QR sketches differ from the single process's draws, which moves P only by column
// signs and rounding (the update P Q^T is sign-invariant): tolerance 1e-5.
struct DionShardCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  int64_t outer_dim;
  bool tp = false;    // 2 x 2 mesh: outer over "fs", the other matrix dim over "tp"
  bool hsdp = false;  // outer over "fs", replicas over "dp" with optimizer-side sync
  double rank_fraction = 1.0;
  // hsdp + tp: the 2 x 2 x 2 mesh dp x fs x tp. With replicas, synchronize_for_checkpoint() must
  // also bring every replica's (decoupled) momentum to the single-process momentum.
};

void dion_shard_case(Child& c, const DionShardCase& k) {
  Problem prob = make_problem(k.shapes, 3, 31);
  std::shared_ptr<Group> outer, inner, replica;
  std::optional<dion::comm::DeviceMesh> mesh;
  if (k.tp || k.hsdp) {
    std::vector<std::pair<std::string, int>> axes;
    if (k.hsdp) axes.push_back({"dp", 2});
    axes.push_back({"fs", 2});
    if (k.tp) axes.push_back({"tp", 2});
    mesh.emplace(c.world, axes);
    outer = mesh->axis("fs");
    if (k.tp) inner = mesh->axis("tp");
    if (k.hsdp) replica = mesh->axis("dp");
  } else {
    outer = std::make_shared<Group>(c.world);
  }
  const int64_t inner_dim = k.tp ? 1 - k.outer_dim : -1;
  auto local_of = [&](const at::Tensor& full) {
    at::Tensor t = dion::comm::shard_tensor(full, k.outer_dim, outer->size(), outer->rank());
    return inner ? dion::comm::shard_tensor(t, inner_dim, inner->size(), inner->rank()) : t;
  };
  // HSDP: each replica sees its own gradient; their mean is prob.grads.
  auto grad_of = [&](const at::Tensor& mean, int t, size_t i) {
    if (!replica) return mean;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + 100 * t + 10 * i);
    at::Tensor a = at::randn(mean.sizes(), gen), b = at::randn(mean.sizes(), gen);
    at::Tensor centered = (replica->rank() == 0 ? a : b) - (a + b) / 2;
    return (mean + centered).contiguous();
  };
  dion::Options opts = dion::Dion::defaults().lr(0.02).rank_fraction(k.rank_fraction);
  at::manual_seed(9);
  std::vector<at::Tensor> expected, expected_momentum;
  {
    for (const auto& full : prob.params) expected.push_back(full.clone());
    dion::Dion single_opt({{expected}}, opts);
    single_opt.init_state();
    for (const auto& gs : prob.grads) {
      for (size_t i = 0; i < expected.size(); ++i) expected[i].mutable_grad() = gs[i].clone();
      single_opt.step();
    }
    for (const auto& p : expected) expected_momentum.push_back(single_opt.state_of(p)->momentum().clone());
  }
  at::manual_seed(9);
  auto dist = inner ? std::make_shared<Distributed>(outer, inner) : std::make_shared<Distributed>(outer);
  if (replica) dist->replicate(replica, /*sync_gradients=*/true);
  std::vector<at::Tensor> params;
  for (const auto& full : prob.params) {
    params.push_back(local_of(full));
    dist->shard(params.back(), full.sizes().vec(), k.outer_dim, inner_dim);
  }
  dion::Dion opt({{params}}, opts);
  opt.set_distribution(dist);
  opt.init_state();
  for (int t = 0; t < static_cast<int>(prob.grads.size()); ++t) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = local_of(grad_of(prob.grads[t][i], t, i));
    opt.step();
  }
  auto gather = [&](const at::Tensor& local, size_t i) {
    at::Tensor full = local.contiguous();
    if (inner) full = dion::comm::gather_tensor(*inner, full, inner_dim, prob.params[i].size(inner_dim));
    return dion::comm::gather_tensor(*outer, full, k.outer_dim, prob.params[i].size(k.outer_dim));
  };
  for (size_t i = 0; i < params.size(); ++i)
    c.compare("dion " + k.name + " p" + std::to_string(i), gather(params[i], i), expected[i], 1e-5);
  if (replica) {
    opt.synchronize_for_checkpoint();
    for (size_t i = 0; i < params.size(); ++i)
      c.compare("dion " + k.name + " synchronized momentum " + std::to_string(i),
                gather(opt.state_of(params[i])->momentum(), i), expected_momentum[i], 1e-5);
  }
}

void scenario_dion_fsdp(Child& c) {
  dion_shard_case(c, {"fsdp rows", {{32, 64}, {32, 64}, {24, 40}, {18, 30}, {3, 16}}, 0});
  dion_shard_case(c, {"fsdp cols", {{64, 32}, {48, 32}, {40, 40}, {30, 18}}, 1});
  dion_shard_case(c, {"fsdp rows low rank", {{32, 64}, {24, 40}}, 0, false, false, 0.5});
}

// DP x FSDP x TP = 2 x 2 x 2 (8 processes), with and without compressed sync.
void scenario_dion_3d(Child& c) {
  dion_shard_case(c, {"dp x fs x tp compressed", {{32, 64}, {24, 40}}, 0, true, true, 0.25});
  dion_shard_case(c, {"dp x fs x tp gradient sync", {{32, 64}, {24, 40}}, 0, true, true, 1.0});
}

void scenario_dion_2d(Child& c) {
  dion_shard_case(c, {"fsdp x tp", {{32, 64}, {32, 64}, {24, 40}, {18, 30}}, 0, true});
  dion_shard_case(c, {"fsdp x tp low rank", {{32, 64}, {24, 40}}, 0, true, false, 0.5});
  dion_shard_case(c, {"hsdp compressed", {{32, 64}, {32, 64}, {24, 40}}, 0, false, true, 0.25});
}

// num_heads and split_sizes on row shards, and the layout errors every rank must raise alike.
void scenario_heads_splits_errors(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  const int W = group->size(), r = group->rank();
  // run_sharded gives the distribution to the constructor: the num_heads / split_sizes checks
  // must see the global shapes, not the shards'.
  auto sharded_run = [&](const Problem& prob, const dion::Options& opts) { return run_sharded(prob, opts, group, 0); };
  auto compare_all = [&](const std::string& what, const Problem& prob, const dion::Options& opts) {
    auto expected = single(prob, opts);
    auto got = sharded_run(prob, opts);
    for (size_t i = 0; i < got.size(); ++i)
      c.compare(what + " p" + std::to_string(i), dion::comm::gather_tensor(*group, got[i], 0, prob.params[i].size(0)),
                expected[i], 1e-5);
  };
  // num_heads: 8 heads of 4 rows; every rank holds whole heads, orthogonalized where they are.
  Problem heads = make_problem({{32, 24}, {32, 24}}, 2, 41);
  for (const char* algo : {"muon", "normuon", "dion2", "nordion2"})
    compare_all(std::string(algo) + " num_heads 8", heads, options_for(algo).num_heads(8));
  // split_sizes on a fused QKV-like weight whose rows divide evenly over the ranks.
  Problem qkv = make_problem({{32, 16}}, 2, 43);
  compare_all("muon split_sizes", qkv, options_for("muon").split_sizes({16, 8, 8}));

  auto expect_error = [&](const std::string& what, const Problem& prob, const dion::Options& opts, const char* type) {
    try {
      sharded_run(prob, opts);
      std::printf("[rank %d] %s: no error\n", r, what.c_str());
      ++c.failures;
    } catch (const dion::NotImplementedError& e) {
      if (std::string(type) != "NotImplementedError") ++c.failures;
      if (r == 0) std::printf("[rank 0] %s: NotImplementedError: %.140s\n", what.c_str(), e.what());
    } catch (const dion::ValueError& e) {
      if (std::string(type) != "ValueError") ++c.failures;
      if (r == 0) std::printf("[rank 0] %s: ValueError: %.140s\n", what.c_str(), e.what());
    }
  };
  // 3 heads cannot be split over the ranks; 30 rows break split_sizes over 4 ranks (not over 2).
  expect_error("num_heads not divisible by the world", make_problem({{12, 8}}, 1, 1), options_for("muon").num_heads(3),
               "ValueError");
  if (W == 4)
    expect_error("split_sizes with interleaved padding", make_problem({{30, 8}}, 1, 1),
                 options_for("muon").split_sizes({10, 10, 10}), "NotImplementedError");
  // A mesh that does not multiply to the world size.
  try {
    dion::comm::DeviceMesh mesh(c.world, {{"dp", 3}, {"fs", 2}});
    ++c.failures;
  } catch (const dion::ValueError& e) {
    if (r == 0) std::printf("[rank 0] mesh 3 x 2: ValueError: %s\n", e.what());
  }
}

// A shard of the wrong size on one rank: every rank raises ValueError (none waits forever).
void scenario_bad_spec(Child& c) {
  auto group = std::make_shared<Group>(c.world);
  auto dist = std::make_shared<Distributed>(group);
  at::Tensor full = at::randn({16, 32});
  at::Tensor local = dion::comm::shard_tensor(full, 0, group->size(), group->rank());
  if (group->rank() == 1) local = at::randn({3, 32});  // wrong on rank 1 only
  dist->shard(local, {16, 32}, 0);
  dion::Optimizer opt({local}, options_for("muon"));
  opt.set_distribution(dist);
  local.mutable_grad() = at::randn_like(local);
  try {
    opt.step();
    std::printf("[rank %d] expected a ValueError\n", group->rank());
    ++c.failures;
  } catch (const dion::ValueError& e) {
    std::printf("[rank %d] ValueError: %s\n", group->rank(), e.what());
  }
}

// A rank that dies: the survivors raise CommError within the timeout.
void scenario_dead_rank(Child& c) {
  if (c.world.rank() == 1) std::_Exit(3);
  at::Tensor x = at::ones({4});
  try {
    c.world.all_gather(x);
    std::printf("[rank %d] all_gather returned although rank 1 died\n", c.world.rank());
    ++c.failures;
  } catch (const dion::comm::CommError& e) {
    std::printf("[rank %d] CommError: %.300s\n", c.world.rank(), e.what());
  }
}

// ---------------------------------------------------------------------------- the tests

TEST(Distributed, DdpTwoRanks) { expect_all_ok("ddp", 2); }
TEST(Distributed, DdpFourRanks) { expect_all_ok("ddp", 4); }
TEST(Distributed, FsdpRowShardedTwoRanks) { expect_all_ok("fsdp_rows", 2); }
TEST(Distributed, FsdpRowShardedUnevenAndEmptyFourRanks) { expect_all_ok("fsdp_rows", 4); }
TEST(Distributed, FsdpColumnSharded) { expect_all_ok("fsdp_cols", 2); }
TEST(Distributed, BatchSharded3D) { expect_all_ok("batch", 2); }
TEST(Distributed, FsdpDion2EveryShapeEqualsOneProcessTwoRanks) { expect_all_ok("fsdp_every_shape", 2); }
TEST(Distributed, FsdpDion2EveryShapeEqualsOneProcessFourRanks) { expect_all_ok("fsdp_every_shape", 4); }
TEST(Distributed, Hsdp2x2) { expect_all_ok("hsdp", 4); }
TEST(Distributed, FsdpTimesTp2x2) { expect_all_ok("tp", 4); }
TEST(Distributed, Dion2EveryLayoutEqualsOneProcess2x2) { expect_all_ok("every_layout", 4); }
TEST(Distributed, OverlapOnOneThreadMatchesOneTaskInFlight) { expect_all_ok("overlap", 2); }
TEST(Distributed, Dion2MovesFractionOfMuonBytes) { expect_all_ok("bytes", 2); }
TEST(Distributed, DionDdpGradientAndCompressedSyncTwoRanks) { expect_all_ok("dion_ddp", 2); }
TEST(Distributed, DionDdpGradientAndCompressedSyncFourRanks) { expect_all_ok("dion_ddp", 4); }
TEST(Distributed, DionFsdpTwoRanks) { expect_all_ok("dion_fsdp", 2); }
TEST(Distributed, DionFsdpUnevenAndEmptyFourRanks) { expect_all_ok("dion_fsdp", 4); }
TEST(Distributed, DionFsdpTimesTpAndHsdpCompressed2x2) { expect_all_ok("dion_2d", 4); }
TEST(Distributed, HeadsSplitsAndLayoutErrorsTwoRanks) { expect_all_ok("heads_splits_errors", 2); }
TEST(Distributed, HeadsSplitsAndLayoutErrorsFourRanks) { expect_all_ok("heads_splits_errors", 4); }
TEST(Distributed, DionDpTimesFsdpTimesTp2x2x2) { expect_all_ok("dion_3d", 8); }
TEST(Distributed, BadShardSpecRaisesOnEveryRank) { expect_all_ok("bad_spec", 2); }

TEST(Distributed, DeadRankFailsTheOthersWithinTimeout) {
  RunResult r = launch("dead_rank", 2, 90);
  EXPECT_EQ(r.exit_codes[1], 3) << "rank 1 should have exited on purpose";
  EXPECT_EQ(r.exit_codes[0], 0) << "rank 0 should have raised CommError (-1: it hung and was killed)";
  EXPECT_LT(r.seconds, 60.0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, dion::testing::Scenario> scenarios = {
      {"ddp", scenario_ddp},
      {"fsdp_rows", scenario_fsdp_rows},
      {"fsdp_cols", scenario_fsdp_cols},
      {"fsdp_every_shape", scenario_fsdp_every_shape},
      {"batch", scenario_batch_sharded},
      {"hsdp", scenario_hsdp},
      {"bytes", scenario_bytes},
      {"bad_spec", scenario_bad_spec},
      {"dead_rank", scenario_dead_rank},
      {"dion_ddp", scenario_dion_ddp},
      {"tp", scenario_tp},
      {"overlap", scenario_overlap},
      {"every_layout", scenario_every_layout},
      {"dion_fsdp", scenario_dion_fsdp},
      {"dion_2d", scenario_dion_2d},
      {"heads_splits_errors", scenario_heads_splits_errors},
      {"dion_3d", scenario_dion_3d}};
  // A dead peer should be noticed quickly; healthy scenarios get a generous timeout.
  return dion::testing::multiprocess_main(argc, argv, scenarios, [](const std::string& name) {
    return name == "dead_rank" ? std::chrono::seconds(5) : std::chrono::seconds(60);
  });
}
