// The optimizer's communication patterns (dion/optim/collectives.h) in one process: W simulated
// ranks (tests/support/fake_distribution.h) step sharded or replicated parameters, and the
// reassembled result is compared with one process's step on the whole parameters.
//
// Tolerances (relative to the largest expected magnitude), as in tests/optim/test_dist.cpp:
//   - DDP: 0 (every matrix goes through the same kernels as in one process);
//   - FSDP, Dion2 selecting across the shards: 1e-5 (zero padding rows in the assembled
//     matrices; partial norms summed in another order); observed 0;
//   - Dion2 selecting along a sharded dim: 1e-3 (the selected slices reach the
//     orthogonalization rank-major, not in one process's top-k order: bf16 rounding moves);
//   - legacy Dion: 1e-5 (each rank draws the sketch; P changes by column signs and rounding);
//   - NorMuon / NorDion2 with sharded columns: see their test.
// Also pinned: every rank issues the same collectives (the fake throws on a mismatch or a
// missing member instead of hanging), a failing rank does not hang the others, and the fake runs
// the production assembly and shard checks (it implements only the per-axis collectives).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "cpu_kind.h"
#include "dion/dion.h"
#include "fake_distribution.h"
#include "table_values.h"

namespace {

// One process and the ranks' shares run bf16 GEMMs over other batch sizes: oneDNN off, so that
// both run ATen's gemm per matrix and compare at tolerance 0 (tests/support/cpu_kind.h).
[[maybe_unused]] const bool kBatchInvariantGemms = dion::testing::pin_batch_invariant_bf16_gemms();

using dion::testing::FakeWorld;

// FSDP2 chunk `r` of `W` along `dim`.
at::Tensor chunk_of(const at::Tensor& full, int64_t dim, int W, int r) {
  const int64_t size = full.size(dim), c = (size + W - 1) / W;
  const int64_t start = std::min(size, c * r), end = std::min(size, c * (r + 1));
  return full.narrow(dim, start, end - start).clone(at::MemoryFormat::Contiguous);
}

struct Problem {
  std::vector<at::Tensor> params;
  std::vector<std::vector<at::Tensor>> grads;  // [step][param]
};

Problem make_problem(const std::vector<std::vector<int64_t>>& shapes, int steps, uint64_t seed) {
  at::manual_seed(seed);
  Problem p;
  for (const auto& s : shapes) p.params.push_back(at::randn(s));
  for (int t = 0; t < steps; ++t) {
    std::vector<at::Tensor> g;
    for (const auto& s : shapes) g.push_back(at::randn(s));
    p.grads.push_back(g);
  }
  return p;
}

// One process on whole parameters.
std::vector<at::Tensor> single(const Problem& prob, const dion::Options& opts) {
  std::vector<at::Tensor> params;
  for (const auto& p : prob.params) params.push_back(p.clone());
  at::manual_seed(9);
  dion::Optimizer opt(params, opts);
  opt.init_state();
  for (const auto& gs : prob.grads) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = gs[i].clone();
    opt.step();
  }
  return params;
}

// The layout of a run on the fake world: which dims the outer / inner axes shard (-1: none;
// outer -1 means DDP: every rank holds every parameter).
struct Sharding {
  int64_t outer_dim = -1, inner_dim = -1;
};

at::Tensor local_of(const at::Tensor& full, const FakeWorld& w, int r, Sharding s) {
  at::Tensor t = full.clone();
  if (s.outer_dim >= 0) t = chunk_of(t, s.outer_dim, w.outer(), w.axis_rank(dion::Axis::OUTER, r));
  if (s.inner_dim >= 0) t = chunk_of(t, s.inner_dim, w.inner(), w.axis_rank(dion::Axis::INNER, r));
  return t;
}

// Every rank's step on its part; returns each rank's local parameters.
std::vector<std::vector<at::Tensor>> distributed(FakeWorld& world, const Problem& prob, const dion::Options& opts,
                                                 Sharding s) {
  std::vector<std::vector<at::Tensor>> locals(static_cast<size_t>(world.size()));
  at::manual_seed(9);
  world.run([&](int r) {
    auto dist = world.distribution(r);
    auto& params = locals[static_cast<size_t>(r)];
    for (const auto& full : prob.params) {
      params.push_back(local_of(full, world, r, s));
      if (s.outer_dim >= 0) dist->shard(params.back(), full.sizes().vec(), s.outer_dim, s.inner_dim);
    }
    dion::Optimizer opt(params, opts, {}, dist);
    opt.init_state();
    for (const auto& gs : prob.grads) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = local_of(gs[i], world, r, s);
      opt.step();
    }
  });
  return locals;
}

// Reassemble parameter i from every rank's part.
at::Tensor whole(const FakeWorld& w, const std::vector<std::vector<at::Tensor>>& locals, size_t i, Sharding s) {
  if (s.outer_dim < 0) return locals[0][i];
  std::vector<at::Tensor> rows;
  for (int o = 0; o < w.outer(); ++o) {
    std::vector<at::Tensor> parts;
    for (int t = 0; t < w.inner(); ++t) parts.push_back(locals[static_cast<size_t>(o * w.inner() + t)][i]);
    rows.push_back(s.inner_dim >= 0 ? at::cat(parts, s.inner_dim) : parts[0]);
  }
  return at::cat(rows, s.outer_dim);
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-30);
}

// Returns the largest relative difference of the updates (param - initial) from one process's.
double expect_like_one_process(const std::string& what, const std::vector<std::vector<int64_t>>& shapes,
                               const dion::Options& opts, int outer, int inner, Sharding s, double tol) {
  Problem prob = make_problem(shapes, 2, 41);
  const auto expected = single(prob, opts);
  FakeWorld world(outer, inner);
  const auto locals = distributed(world, prob, opts, s);
  double worst_update = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const at::Tensor got = whole(world, locals, i, s);
    worst_update = std::max(worst_update, relative(got - prob.params[i], expected[i] - prob.params[i]));
    if (tol < 0) continue;  // expected to differ: the caller checks worst_update
    const double d = relative(got, expected[i]);
    EXPECT_LE(d, tol) << what << " p" << i;
    // DDP: every rank must hold the same result.
    if (s.outer_dim < 0) {
      for (int r = 1; r < world.size(); ++r) {
        EXPECT_TRUE(locals[static_cast<size_t>(r)][i].equal(locals[0][i])) << what;
      }
    }
  }
  // Every rank issued the same collectives, and some were issued.
  const auto& calls0 = world.distribution(0)->calls();
  EXPECT_FALSE(calls0.empty()) << what << ": no collective was issued";
  for (int r = 1; r < world.size(); ++r) {
    EXPECT_EQ(world.distribution(r)->calls(), calls0) << what;
  }
  return worst_update;
}

dion::Options dion2(double fraction, const char* scope) {
  return dion::Options(0.02).algorithm("dion2").weight_decay(0.01).fraction(fraction).selection_scope(scope);
}

const std::vector<std::vector<int64_t>> kTall = {{96, 32}, {40, 24}, {40, 24}}, kWide = {{24, 40}, {32, 96}};

TEST(FakeDistribution, DdpMuonAndDion2EqualOneProcess) {
  for (const char* algo : {"muon", "normuon", "dion2", "nordion2"})
    expect_like_one_process(std::string(algo) + " ddp", {{16, 32}, {16, 32}, {16, 32}, {24, 24}},
                            dion::Options(0.02).algorithm(algo).fraction(0.5), 2, 1, {}, 0.0);
}

TEST(FakeDistribution, FsdpDion2EqualsOneProcessTwoRanks) {
  for (const char* scope : {"global", "local"}) {
    // Tall, row-sharded: columns selected across the shards (partial norms summed).
    expect_like_one_process(std::string("dion2 fsdp tall rows ") + scope, kTall, dion2(0.25, scope), 2, 1, {0, -1},
                            1e-5);
    // Wide, column-sharded: rows selected across the shards.
    expect_like_one_process(std::string("dion2 fsdp wide cols ") + scope, kWide, dion2(0.25, scope), 2, 1, {1, -1},
                            1e-5);
  }
  // Along the sharded dim: the exact global top-k from the shards' norms (global scope).
  expect_like_one_process("dion2 fsdp wide rows global", kWide, dion2(0.25, "global"), 2, 1, {0, -1}, 1e-3);
  expect_like_one_process("nordion2 fsdp tall rows global", kTall,
                          dion::Options(dion2(0.25, "global")).algorithm("nordion2"), 2, 1, {0, -1}, 1e-3);
  // The reference's selection (selection_dim "shard": along the sharded rows) is not one
  // process's on tall matrices: the comparison above would fail for it.
  EXPECT_GT(expect_like_one_process("dion2 fsdp tall rows, selection_dim shard", kTall,
                                    dion2(0.25, "global").selection_dim("shard"), 2, 1, {0, -1}, -1),
            1e-2);
}

TEST(FakeDistribution, FsdpTimesTpDion2EqualsOneProcess) {
  for (const char* scope : {"global", "local"}) {
    expect_like_one_process(std::string("dion2 fsdp x tp tall ") + scope, kTall, dion2(0.25, scope), 2, 2, {0, 1},
                            1e-3);
    expect_like_one_process(std::string("dion2 fsdp x tp wide ") + scope, kWide, dion2(0.25, scope), 2, 2, {0, 1},
                            1e-3);
  }
}

// NorMuon and NorDion2 where each rank holds part of every row: sharded along the last dim (an
// FSDP shard of a column-parallel weight, TP's of a row-parallel one), and 2-D sharding both ways
// round (the trainer's column-parallel c_q / c_fc: TP, the inner axis, on dim 0 and FSDP on dim
// 1). The per-neuron sums of U^2 cross the column blocks and the Frobenius norms all the shards,
// so each equals one process (these layouts were refused before: "per-neuron statistics need
// whole rows").
// Tolerances. Parameters, as above: 1e-5 where the selection is one process's in its order
// (observed <= 4e-8: per-row sums over the blocks divided by n instead of one mean), 1e-3 where
// NorDion2's selected rows reach the orthogonalization rank-major (2-D: exact_global along the
// row dim; observed 2e-8). The updates (parameter - initial) are checked too, because a wrong
// normalization is diluted in the parameters (a missing sum over the column blocks, tried by
// removing it, moved the parameters by only 5e-4 to 1.3e-3 relative but the updates by 0.09 to
// 0.31): <= 1e-3 (observed <= 3.6e-5, the fp32 rounding of parameters of magnitude ~4), 2e-2 in
// the rank-major cases (a few bf16 ulps, 2^-8, of the orthogonalized rows; observed 8e-6).
TEST(FakeDistribution, NorMuonAndNorDion2WithShardedColumnsEqualOneProcess) {
  const auto opts = [](const char* algo, const char* scope) { return dion2(0.25, scope).algorithm(algo); };
  const auto check = [](const std::string& what, const std::vector<std::vector<int64_t>>& shapes,
                        const dion::Options& o, int outer, int inner, Sharding s, bool rank_major) {
    const double update = expect_like_one_process(what, shapes, o, outer, inner, s, rank_major ? 1e-3 : 1e-5);
    EXPECT_LE(update, rank_major ? 2e-2 : 1e-3) << what << ": the updates differ";
  };
  const std::vector<std::vector<int64_t>> mixed = {{24, 40}, {40, 24}, {40, 24}, {32, 96}};
  for (int W : {2, 3}) {  // 3: uneven chunks (40 = 14 + 14 + 12), padded in the assembly
    const std::string w = " W" + std::to_string(W);
    check("normuon cols" + w, mixed, opts("normuon", "local"), W, 1, {1, -1}, false);
    for (const char* scope : {"global", "local"})
      check(std::string("nordion2 cols ") + scope + w, mixed, opts("nordion2", scope), W, 1, {1, -1}, false);
  }
  // 3 columns over 4 ranks: 1 + 1 + 1 + 0, an empty shard (its V is [m, 0]).
  check("normuon cols empty shard", {{12, 3}, {12, 3}}, opts("normuon", "local"), 4, 1, {1, -1}, false);
  check("nordion2 cols empty shard", {{12, 3}, {12, 3}}, opts("nordion2", "local"), 4, 1, {1, -1}, false);
  // 3-D batches of matrices sharded along the last dim; NorMuon also flattened.
  const std::vector<std::vector<int64_t>> batched = {{3, 16, 20}, {2, 12, 30}};
  check("normuon 3-D cols", batched, opts("normuon", "local"), 2, 1, {2, -1}, false);
  check("normuon 3-D cols flatten", batched, opts("normuon", "local").flatten(true), 2, 1, {2, -1}, false);
  check("nordion2 3-D cols", batched, opts("nordion2", "global"), 2, 1, {2, -1}, false);
  // split_sizes: row blocks stay whole on every rank when only the columns are sharded.
  check("normuon cols split_sizes", {{32, 16}, {32, 16}}, opts("normuon", "local").split_sizes({16, 8, 8}), 2, 1,
        {1, -1}, false);
  // 2-D: the trainer's column-parallel layout {1, 0} and the row-parallel one {0, 1}.
  for (const Sharding s : {Sharding{1, 0}, Sharding{0, 1}}) {
    const std::string where = " fsdp x tp {" + std::to_string(s.outer_dim) + "," + std::to_string(s.inner_dim) + "}";
    check("normuon" + where, mixed, opts("normuon", "local"), 2, 2, s, false);
    for (const char* scope : {"global", "local"})
      check(std::string("nordion2 ") + scope + where, mixed, opts("nordion2", scope), 2, 2, s, true);
  }
}

// What stays refused, on every rank alike, before the megabatch's collectives: the cases that would
// not equal one process.
TEST(FakeDistribution, NorMuonAndNorDion2LayoutsThatAreNotOneProcessAreRefused) {
  const auto refused = [](const char* what, const std::vector<std::vector<int64_t>>& shapes, const dion::Options& o,
                          Sharding s, const char* says) {
    FakeWorld world(2);
    std::vector<std::string> errors(2);
    world.run([&](int r) {
      std::vector<at::Tensor> params;
      for (const auto& shape : shapes) {
        params.push_back(local_of(at::randn(shape), world, r, s));
        world.distribution(r)->shard(params.back(), shape, s.outer_dim, s.inner_dim);
        params.back().mutable_grad() = at::randn_like(params.back());
      }
      dion::Optimizer opt(params, o, {}, world.distribution(r));
      try {
        opt.step();
      } catch (const dion::NotImplementedError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
    for (const std::string& e : errors) EXPECT_NE(e.find(says), std::string::npos) << what << ": " << e;
  };
  // NorMuon's per-block normalization needs each row block on one rank.
  refused("normuon split_sizes on rows", {{32, 16}}, dion::Options(0.02).algorithm("normuon").split_sizes({16, 8, 8}),
          {0, -1}, "normuon with split_sizes on parameters sharded along their rows");
  // NorDion2 selecting rows of flattened matrices whose last dim is sharded.
  refused("nordion2 flatten cols", {{4, 6, 8}}, dion::Options(0.02).algorithm("nordion2").flatten(true), {2, -1},
          "nordion2 with flatten on a parameter sharded along its last dim");
}

TEST(FakeDistribution, FsdpLegacyDionEqualsOneProcess) {
  const dion::Options opts = dion::Dion::defaults().lr(0.02);
  // Dion works on M^T when the FSDP dim is 0: wide for row sharding, tall for column sharding.
  expect_like_one_process("dion fsdp rows", {{16, 32}, {12, 40}}, opts, 2, 1, {0, -1}, 1e-5);
  expect_like_one_process("dion fsdp cols", {{32, 16}, {40, 12}}, opts, 2, 1, {1, -1}, 1e-5);
  expect_like_one_process("dion fsdp x tp", {{16, 32}, {12, 40}}, opts, 2, 2, {0, 1}, 1e-5);
}

// The cross-rank check compares exactly the table's communication options (rule `comm`): one
// rank of two changes one hyperparameter; a `comm` field raises ValueError naming it on both
// ranks, any other field steps normally.
TEST(FakeDistribution, RanksDisagreeingOnACommunicationOptionRaise) {
  const dion::Options base = dion::Options(0.02).algorithm("normuon");
  size_t comm_fields = 0;
#define CHECK_AGREEMENT(T, name, default_value, rule_object, doc)                                                 \
  {                                                                                                               \
    SCOPED_TRACE(#name);                                                                                          \
    const bool comm = (rule_object).comm;                                                                         \
    comm_fields += comm;                                                                                          \
    dion::Options changed = base;                                                                                 \
    changed.name(dion::testing::other_value(base.name(), rule_object));                                           \
    FakeWorld world(2);                                                                                           \
    std::vector<std::string> errors(2);                                                                           \
    world.run([&](int r) {                                                                                        \
      at::Tensor p = at::ones({8, 8});                                                                            \
      dion::Optimizer opt({p}, r == 0 ? base : changed, {}, world.distribution(r));                               \
      p.mutable_grad() = at::ones_like(p);                                                                        \
      try {                                                                                                       \
        opt.step();                                                                                               \
      } catch (const dion::ValueError& e) {                                                                       \
        errors[static_cast<size_t>(r)] = e.what();                                                                \
      }                                                                                                           \
    });                                                                                                           \
    for (const std::string& e : errors) {                                                                         \
      if (comm) {                                                                                                 \
        EXPECT_NE(e.find(std::string("): ") + #name + " is "), std::string::npos) << "no error naming it: " << e; \
      } else {                                                                                                    \
        EXPECT_EQ(e, "") << "not a communication option";                                                         \
      }                                                                                                           \
    }                                                                                                             \
  }
  DION_HYPERPARAMETERS(CHECK_AGREEMENT)
#undef CHECK_AGREEMENT
  EXPECT_GE(comm_fields, 5u);
}

// The fake is only the per-axis collectives: the assembly is the production one (FSDP: one
// all_to_all there and one back per megabatch), and so is the shard-spec check (a wrong shard on
// one rank raises ValueError on both, at the first step, before any megabatch is assembled).
TEST(FakeDistribution, ProductionAssemblyAndShardChecksRunOnTheFake) {
  FakeWorld world(2);
  world.run([&](int r) {
    at::Tensor p = chunk_of(at::randn({16, 8}), 0, 2, r);
    world.distribution(r)->shard(p, {16, 8}, 0);
    p.mutable_grad() = at::randn_like(p);
    dion::Optimizer opt({p}, dion::Options(0.02).algorithm("muon"), {}, world.distribution(r));
    opt.step();
  });
  EXPECT_EQ(world.distribution(0)->calls().at("all_to_all"), 2);
  EXPECT_EQ(world.distribution(1)->calls(), world.distribution(0)->calls());

  FakeWorld bad(2);
  std::vector<std::string> errors(2);
  bad.run([&](int r) {
    at::Tensor p = r == 1 ? at::randn({3, 8}) : chunk_of(at::randn({16, 8}), 0, 2, r);  // rank 1: 3 rows, not 8
    bad.distribution(r)->shard(p, {16, 8}, 0);
    p.mutable_grad() = at::randn_like(p);
    dion::Optimizer opt({p}, dion::Options(0.02).algorithm("muon"), {}, bad.distribution(r));
    try {
      opt.step();
    } catch (const dion::ValueError& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  EXPECT_NE(errors[1].find("does not match global shape"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("invalid shard specification on 1 other rank(s)"), std::string::npos) << errors[0];
  EXPECT_EQ(bad.distribution(0)->calls().count("all_to_all"), 0u);
}

TEST(FakeDistribution, MismatchedCollectivesThrowInsteadOfHanging) {
  FakeWorld world(2);
  EXPECT_THROW(world.run([&](int r) {
    at::Tensor x = at::ones({4});
    if (r == 0)
      world.distribution(r)->all_reduce_(x, dion::Axis::OUTER);
    else
      world.distribution(r)->all_gather(x, dion::Axis::OUTER);
  }),
               std::runtime_error);
  FakeWorld lonely(2);
  EXPECT_THROW(lonely.run([&](int r) {
    at::Tensor x = at::ones({4});
    if (r == 0) lonely.distribution(r)->all_reduce_(x, dion::Axis::OUTER);  // rank 1 never joins
  }),
               std::runtime_error);
}

}  // namespace
