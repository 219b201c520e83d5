// Expert parallelism (Distribution::shard_over): an MoE's expert stacks [E, out, in] split along
// dim 0 over an EP group that is not the outer one, on simulated ranks in one process
// (tests/support/fake_distribution.h).
//
// Two meshes:
//   "ep = dp":      2 ranks; the EP group is the outer (DDP) group's ranks, the dense matrices
//                   replicated over it;
//   "ep beside fs": 4 ranks, r = 2 * fs_rank + ep_rank; the outer group is fs ({0, 2}, {1, 3}),
//                   the dense matrices replicated over it, the EP groups the other pairs
//                   ({0, 1}, {2, 3}): every EP group holds all 4 experts, 2 a rank, and its
//                   only link to the other EP group is the outer groups.
// Each compares several steps with one process holding every parameter whole.
//
// Tolerance 0 everywhere (bit for bit): every algorithm treats each matrix of a stack on its own
// (Muon's / NorMuon's Newton-Schulz and normalizations, Dion2's / NorDion2's selection, top-k and
// scales are per matrix, batched over the leading dims), so a rank holding 2 of the 4 experts
// computes on each matrix what one process computes on it inside the batch of 4; the dense
// matrices are DDP (whole matrices, split across ranks). Measured: 0 on every case. (Dense
// matrices FSDP-sharded beside the experts differ from one process as FSDP does alone, per
// tests/optim/test_fake_dist.cpp: not this test's subject.)
//
// Also pinned: uneven and empty EP chunks (E = 3 and 1 over 2 ranks) equal one process too; the
// expert stacks issue no collective (their EP group sees only the one-time
// shard-spec check, and an optimizer over experts alone issues only the per-step agreement
// check); a wrong local shape raises ValueError on every rank (also on the ranks that reach it
// only through the EP group); a matrix dim split over the stack's own group is assembled there
// (FSDP over a group of its own: AMatrixDimSplitOverItsOwnGroupIsAssembledThere); flatten, and
// legacy Dion, are refused with what would work; a checkpoint saved at EP 2 loads at EP 1 (one
// process) and the reverse, and continues exactly as an unsplit run.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/serialize/archive.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_kind.h"
#include "dion/dion.h"
#include "fake_distribution.h"

namespace {

// One process and the ranks' shares run bf16 GEMMs over other batch sizes: oneDNN off, so that
// both run ATen's gemm per matrix and compare at tolerance 0 (tests/support/cpu_kind.h).
[[maybe_unused]] const bool kBatchInvariantGemms = dion::testing::pin_batch_invariant_bf16_gemms();

using dion::Axis;
using dion::testing::FakeWorld;
using Calls = std::map<std::string, int>;

// Parameters 0 to 2: expert stacks (0 and 2 one megabatch of two stacks); 3 and 4: dense
// matrices of one shape (a DDP megabatch of 2, split across the ranks).
const std::vector<std::vector<int64_t>> kShapes = {{4, 24, 40}, {4, 40, 24}, {4, 24, 40}, {32, 48}, {32, 48}};
constexpr size_t kExperts = 3;
constexpr int kSteps = 3;

struct Problem {
  std::vector<at::Tensor> params;
  std::vector<std::vector<at::Tensor>> grads;  // [step][param]
};

Problem make_problem(int steps, uint64_t seed) {
  at::manual_seed(seed);
  Problem p;
  for (const auto& s : kShapes) p.params.push_back(at::randn(s));
  for (int t = 0; t < steps; ++t) {
    std::vector<at::Tensor> g;
    for (const auto& s : kShapes) g.push_back(at::randn(s));
    p.grads.push_back(g);
  }
  return p;
}

// FSDP2 chunk `r` of `W` along `dim`.
at::Tensor chunk_of(const at::Tensor& full, int64_t dim, int W, int r) {
  const int64_t size = full.size(dim), c = (size + W - 1) / W;
  const int64_t start = std::min(size, c * r), end = std::min(size, c * (r + 1));
  return full.narrow(dim, start, end - start).clone(at::MemoryFormat::Contiguous);
}

struct Algo {
  std::string label;
  dion::Options options;
};
std::vector<Algo> algorithms() {
  auto o = [](const char* a) { return dion::Options(0.02).algorithm(a).weight_decay(0.01); };
  return {{"muon", o("muon")},
          {"normuon", o("normuon")},
          {"dion2@0.25", o("dion2").fraction(0.25)},
          {"dion2@1", o("dion2").fraction(1.0)},
          {"nordion2 (dion3)", o("nordion2").fraction(0.5)}};
}

struct Mesh {
  const char* name;
  int outer, inner;  // FakeWorld(outer, inner)
  Axis ep;           // the fake axis that is the EP group; the dense matrices: DDP over the outer one
};
const Mesh kEpIsDp{"ep = dp", 2, 1, Axis::OUTER};
const Mesh kEpBesideFs{"ep beside fs", 2, 2, Axis::INNER};

// One rank's parameters, distribution and optimizer, laid out as `mesh` says.
struct Rank {
  std::vector<at::Tensor> params;
  std::shared_ptr<dion::Distribution> dist;
  std::shared_ptr<Calls> ep_calls = std::make_shared<Calls>();  // collectives on the EP group
  std::unique_ptr<dion::Optimizer> opt;
};

at::Tensor local_of(const at::Tensor& full, size_t i, FakeWorld& w, const Mesh& m, int r) {
  if (i < kExperts) return chunk_of(full, 0, w.axis_size(m.ep), w.axis_rank(m.ep, r));
  return full.clone();
}

// `params`: the whole parameters to start from; `only_experts`: the optimizer holds the stacks only.
Rank make_rank(FakeWorld& w, const Mesh& m, int r, const std::vector<at::Tensor>& params, const dion::Options& opts,
               bool only_experts = false) {
  Rank k;
  // "ep beside fs": a Distribution over the outer (fs) axis alone; the EP group is not its axis.
  k.dist = m.inner == 1 ? std::shared_ptr<dion::Distribution>(w.distribution(r))
                        : std::make_shared<dion::Distribution>(w.axis_group(r, Axis::OUTER));
  auto ep = w.axis_group(r, m.ep, k.ep_calls, "ep");
  for (size_t i = 0; i < params.size(); ++i) {
    if (only_experts && i >= kExperts) break;
    k.params.push_back(local_of(params[i], i, w, m, r));
    if (i < kExperts) k.dist->shard_over(ep, k.params.back(), params[i].sizes().vec(), 0);
  }
  k.opt = std::make_unique<dion::Optimizer>(k.params, opts, dion::math::OrthoConfig{}, k.dist);
  return k;
}

void step_rank(Rank& k, FakeWorld& w, const Mesh& m, int r, const std::vector<at::Tensor>& grads) {
  for (size_t i = 0; i < k.params.size(); ++i) k.params[i].mutable_grad() = local_of(grads[i], i, w, m, r);
  k.opt->step();
}

// One process over whole copies of `params`, steps [from, to) of `prob`.
struct Single {
  std::vector<at::Tensor> params;
  std::unique_ptr<dion::Optimizer> opt;
  Single(const std::vector<at::Tensor>& start, const dion::Options& opts) {
    for (const auto& p : start) params.push_back(p.clone());
    opt = std::make_unique<dion::Optimizer>(params, opts);
  }
  void steps(const Problem& prob, int from, int to) {
    for (int t = from; t < to; ++t) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = prob.grads[t][i].clone();
      opt->step();
    }
  }
};

// Parameter i reassembled from the ranks (an expert stack from rank 0's EP group).
at::Tensor whole(FakeWorld& w, const Mesh& m, const std::vector<Rank>& ranks, size_t i) {
  if (i >= kExperts) return ranks[0].params[i];
  std::vector<at::Tensor> parts;
  const Axis other = m.ep == Axis::OUTER ? Axis::INNER : Axis::OUTER;
  for (int r = 0; r < w.size(); ++r)
    if (w.axis_rank(other, r) == 0) parts.push_back(ranks[static_cast<size_t>(r)].params[i]);
  return at::cat(parts, 0);
}

// Every rank's copy of each parameter equals its slice of `expected`, bit for bit; the ranks of
// an EP group held different experts.
void expect_equal(FakeWorld& w, const Mesh& m, const std::vector<Rank>& ranks, const std::vector<at::Tensor>& expected,
                  const std::string& what) {
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(whole(w, m, ranks, i).equal(expected[i]))
        << what << " p" << i << ": max |diff| " << (whole(w, m, ranks, i) - expected[i]).abs().max().item<double>();
    for (int r = 0; r < w.size(); ++r)
      EXPECT_TRUE(ranks[static_cast<size_t>(r)].params[i].equal(local_of(expected[i], i, w, m, r)))
          << what << " p" << i << " rank " << r;
  }
  for (size_t i = 0; i < kExperts; ++i) {
    const at::Tensor& a = ranks[0].params[i];
    int peer = 0;  // rank 0's EP peer
    for (int r = 1; r < w.size(); ++r)
      if (w.axis_rank(m.ep, r) == 1 && w.axis_rank(m.ep == Axis::OUTER ? Axis::INNER : Axis::OUTER, r) == 0) peer = r;
    ASSERT_NE(peer, 0);
    EXPECT_EQ(a.size(0), 2) << what;
    EXPECT_FALSE(a.equal(ranks[static_cast<size_t>(peer)].params[i])) << what << ": both ranks held the same experts";
  }
}

TEST(ExpertParallel, StepsEqualOneProcessHoldingEveryExpert) {
  const Problem prob = make_problem(kSteps, 17);
  for (const Mesh& m : {kEpIsDp, kEpBesideFs}) {
    for (const Algo& a : algorithms()) {
      const std::string what = std::string(m.name) + ", " + a.label;
      SCOPED_TRACE(what);
      Single one(prob.params, a.options);
      one.steps(prob, 0, kSteps);
      FakeWorld w(m.outer, m.inner);
      std::vector<Rank> ranks(static_cast<size_t>(w.size()));
      w.run([&](int r) {
        Rank& k = ranks[static_cast<size_t>(r)];
        k = make_rank(w, m, r, prob.params, a.options);
        for (int t = 0; t < kSteps; ++t) step_rank(k, w, m, r, prob.grads[t]);
      });
      expect_equal(w, m, ranks, one.params, what);
      // The EP group saw the shard-spec check (one all_reduce) and nothing else; the dense
      // matrices did communicate over the outer group.
      for (const Rank& k : ranks) {
        EXPECT_EQ(*k.ep_calls, (Calls{{"all_reduce", 1}}));
        EXPECT_EQ(w.distribution(0)->calls(), w.distribution(static_cast<int>(&k - ranks.data()))->calls());
      }
      EXPECT_GT(w.distribution(0)->calls().count("all_gather"), 0u);
    }
  }
}

// E not divisible by the EP size: FSDP2 chunks of 2 + 1 experts, and 1 + 0 (rank 1 holds an empty
// [0, 40, 24] stack); still one process's result, bit for bit.
TEST(ExpertParallel, UnevenAndEmptyExpertChunksEqualOneProcess) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 24, 40}, {1, 40, 24}};
  for (const Algo& a : algorithms()) {
    SCOPED_TRACE(a.label);
    at::manual_seed(37);
    std::vector<at::Tensor> start, want;
    std::vector<std::vector<at::Tensor>> grads(kSteps);
    for (const auto& s : shapes) start.push_back(at::randn(s));
    for (auto& g : grads)
      for (const auto& s : shapes) g.push_back(at::randn(s));
    for (const auto& p : start) want.push_back(p.clone());
    dion::Optimizer one(want, a.options);
    for (const auto& g : grads) {
      for (size_t i = 0; i < want.size(); ++i) want[i].mutable_grad() = g[i].clone();
      one.step();
    }
    FakeWorld w(2);
    std::vector<std::vector<at::Tensor>> locals(2);
    w.run([&](int r) {
      auto& mine = locals[static_cast<size_t>(r)];
      auto ep = w.axis_group(r, Axis::OUTER, nullptr, "ep");
      for (const auto& p : start) {
        mine.push_back(chunk_of(p, 0, 2, r));
        w.distribution(r)->shard_over(ep, mine.back(), p.sizes().vec(), 0);
      }
      dion::Optimizer opt(mine, a.options, {}, w.distribution(r));
      for (const auto& g : grads) {
        for (size_t i = 0; i < mine.size(); ++i) mine[i].mutable_grad() = chunk_of(g[i], 0, 2, r);
        opt.step();
      }
    });
    EXPECT_EQ(locals[1][1].size(0), 0);
    for (size_t i = 0; i < shapes.size(); ++i)
      EXPECT_TRUE(at::cat({locals[0][i], locals[1][i]}, 0).equal(want[i])) << "p" << i;
  }
}

// An optimizer over the expert stacks alone: after the first step (the one-time shard-spec
// check), each step issues only the agreement's change check (one all_reduce over the outer
// axis, src/optim/agreement.h): no all_gather, no all_to_all, nothing on the EP group.
TEST(ExpertParallel, ExpertStacksIssueNoCollective) {
  const Problem prob = make_problem(kSteps, 23);
  for (const Mesh& m : {kEpIsDp, kEpBesideFs}) {
    for (const Algo& a : algorithms()) {
      SCOPED_TRACE(std::string(m.name) + ", " + a.label);
      FakeWorld w(m.outer, m.inner);
      std::vector<Calls> after_first(static_cast<size_t>(w.size()));
      std::vector<std::shared_ptr<Calls>> ep(static_cast<size_t>(w.size()));
      w.run([&](int r) {
        Rank k = make_rank(w, m, r, prob.params, a.options, /*only_experts=*/true);
        step_rank(k, w, m, r, prob.grads[0]);
        after_first[static_cast<size_t>(r)] = w.distribution(r)->calls();
        for (int t = 1; t < kSteps; ++t) step_rank(k, w, m, r, prob.grads[t]);
        ep[static_cast<size_t>(r)] = k.ep_calls;
      });
      for (int r = 0; r < w.size(); ++r) {
        Calls grown = w.distribution(r)->calls();
        for (const auto& [kind, n] : after_first[static_cast<size_t>(r)])
          if ((grown[kind] -= n) == 0) grown.erase(kind);
        EXPECT_EQ(grown, (Calls{{"all_reduce", kSteps - 1}})) << "rank " << r;
        EXPECT_EQ(*ep[static_cast<size_t>(r)], (Calls{{"all_reduce", 1}})) << "rank " << r;
      }
    }
  }
}

// A wrong local shape on one rank raises ValueError on every rank. "ep beside fs": the bad rank 3
// is in outer group {1, 3} and EP group {2, 3}; rank 0 hears of it only through both reductions
// in turn (outer to rank 1, then EP {0, 1}), so the EP group's reduction is needed.
TEST(ExpertParallel, WrongLocalShapeRaisesOnEveryRank) {
  const Problem prob = make_problem(1, 29);
  for (const Mesh& m : {kEpIsDp, kEpBesideFs}) {
    SCOPED_TRACE(m.name);
    FakeWorld w(m.outer, m.inner);
    const int bad = w.size() - 1;
    std::vector<std::string> errors(static_cast<size_t>(w.size()));
    w.run([&](int r) {
      auto dist = m.inner == 1 ? std::shared_ptr<dion::Distribution>(w.distribution(r))
                               : std::make_shared<dion::Distribution>(w.axis_group(r, Axis::OUTER));
      auto ep = w.axis_group(r, m.ep, nullptr, "ep");
      at::Tensor p = r == bad ? at::randn({1, 24, 40}) : chunk_of(prob.params[0], 0, 2, w.axis_rank(m.ep, r));
      dist->shard_over(ep, p, {4, 24, 40}, 0);
      p.mutable_grad() = at::randn_like(p);
      dion::Optimizer opt({p}, dion::Options(0.02).algorithm("muon"), {}, dist);
      try {
        opt.step();
      } catch (const dion::ValueError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
    for (int r = 0; r < w.size(); ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      if (r == bad) {
        EXPECT_NE(e.find("local shard of shape [1, 24, 40] on rank 1 of 2 of group 'ep' (shard_over) does not match "
                         "global shape [4, 24, 40] split on dim 0 (expected 2 along dim 0"),
                  std::string::npos)
            << e;
      } else {
        EXPECT_NE(e.find("invalid shard specification on"), std::string::npos) << "rank " << r << ": " << e;
      }
    }
  }
}

// A matrix dim split over the stack's own group (an expert stack whose experts EP splits and whose
// rows FSDP splits over another group: dion_cpp's (Shard(1), Shard(0)) on ("efsdp", "ep"),
// registered per EP rank as shard_over(efsdp, local, [E / ep, out, in], 1)) is assembled over that
// group as FSDP shards are over the outer one (Optimizer::step gives its megabatches a
// Distribution whose outer axis is that group). Muon bit for bit; NorMuon within 1e-6 (per-neuron
// sums over the shards: measured 6e-8); Dion2 on a tall stack (columns selected across the row
// shards) bit for bit. The dense matrix beside it (DDP) is one process's.
TEST(ExpertParallel, AMatrixDimSplitOverItsOwnGroupIsAssembledThere) {
  struct Case {
    const char* label;
    dion::Options options;
    std::vector<int64_t> shape;
    double tol;
  };
  auto o = [](const char* a) { return dion::Options(0.02).algorithm(a).weight_decay(0.01); };
  for (const Case& c : {Case{"muon", o("muon"), {4, 24, 40}, 0.0}, Case{"normuon", o("normuon"), {4, 24, 40}, 1e-6},
                        Case{"dion2@0.25", o("dion2").fraction(0.25), {4, 40, 24}, 0.0}}) {
    SCOPED_TRACE(c.label);
    at::manual_seed(41);
    const at::Tensor start = at::randn(c.shape), dense = at::randn({8, 8});
    std::vector<std::pair<at::Tensor, at::Tensor>> grads;
    for (int t = 0; t < kSteps; ++t) grads.emplace_back(at::randn(c.shape), at::randn({8, 8}));
    at::Tensor want = start.clone(), want_dense = dense.clone();
    dion::Optimizer one({want, want_dense}, c.options);
    for (const auto& [g, gd] : grads) {
      want.mutable_grad() = g.clone();
      want_dense.mutable_grad() = gd.clone();
      one.step();
    }
    FakeWorld w(2);
    std::vector<std::pair<at::Tensor, at::Tensor>> got(2);
    w.run([&](int r) {
      auto own = w.axis_group(r, Axis::OUTER, nullptr, "efsdp");
      at::Tensor p = chunk_of(start, 1, 2, r), d = dense.clone();
      w.distribution(r)->shard_over(own, p, c.shape, 1);
      dion::Optimizer opt({p, d}, c.options, {}, w.distribution(r));
      for (const auto& [g, gd] : grads) {
        p.mutable_grad() = chunk_of(g, 1, 2, r);
        d.mutable_grad() = gd.clone();
        opt.step();
      }
      got[static_cast<size_t>(r)] = {p, d};
    });
    const double diff = (at::cat({got[0].first, got[1].first}, 1) - want).abs().max().item<double>();
    EXPECT_LE(diff, c.tol);
    EXPECT_TRUE(got[0].second.equal(want_dense));
    EXPECT_TRUE(got[1].second.equal(want_dense));
  }
}

// Layouts of an expert stack that would need communication over the EP group are refused at the
// step, on every rank, naming the group index, algorithm and shape and what works.
TEST(ExpertParallel, LayoutsThatWouldCommunicateAreRefused) {
  struct Case {
    const char* name;
    int64_t dim;
    bool flatten;
    const char* says;
  };
  for (const Case& c : {Case{"flatten", 0, true, "flatten makes the stack one matrix"}}) {
    for (const Algo& a : algorithms()) {
      SCOPED_TRACE(std::string(c.name) + ", " + a.label);
      FakeWorld w(2);
      std::vector<std::string> errors(2);
      w.run([&](int r) {
        at::Tensor p = chunk_of(at::randn({4, 24, 40}), c.dim, 2, r);
        w.distribution(r)->shard_over(w.axis_group(r, Axis::OUTER, nullptr, "ep"), p, {4, 24, 40}, c.dim);
        p.mutable_grad() = at::randn_like(p);
        at::Tensor dense = at::randn({8, 8});
        dense.mutable_grad() = at::randn_like(dense);
        dion::Optimizer opt({dense, p}, dion::Options(a.options).flatten(c.flatten), {}, w.distribution(r));
        try {
          opt.step();
        } catch (const dion::NotImplementedError& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
      const std::string algo = a.options.algorithm();
      for (const std::string& e : errors) {
        EXPECT_NE(e.find("param group 0 (" + algo + "), shape [4, 24, 40], split on dim " + std::to_string(c.dim) +
                         " over group 'ep' (shard_over, expert parallelism): " + c.says),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find("what works: an expert stack [E, out, in] split on a batch dim (dim 0), flatten off"),
                  std::string::npos)
            << e;
      }
    }
  }
}

TEST(ExpertParallel, LegacyDionIsRefusedForExpertWeights) {
  FakeWorld w(2);
  std::vector<std::string> errors(2);
  w.run([&](int r) {
    at::Tensor p = chunk_of(at::randn({4, 24, 40}), 0, 2, r);
    w.distribution(r)->shard_over(w.axis_group(r, Axis::OUTER, nullptr, "ep"), p, {4, 24, 40}, 0);
    try {
      dion::Optimizer opt({p}, dion::Options(0.02).algorithm("dion"), {}, w.distribution(r));
    } catch (const dion::NotImplementedError& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_EQ(e,
              "param group 0 (dion), parameter 0 of shape [4, 24, 40]: legacy 'dion' does not support "
              "expert-parallel parameters (shard_over); for expert weights (an MoE's [E, out, in] stacks, expert "
              "parallelism) use Muon, NorMuon, Dion2 or Dion3");
  // Without a Distribution a 3-D stack is refused too, saying the same of expert weights.
  at::Tensor stack = at::randn({4, 24, 40});
  try {
    dion::Optimizer opt({stack}, dion::Options(0.02).algorithm("dion"));
    ADD_FAILURE() << "legacy Dion took a 3-D stack";
  } catch (const dion::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("supports 2-D parameters only; for expert weights"), std::string::npos)
        << e.what();
  }
}

std::string save(const dion::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

void load(dion::Optimizer& opt, const std::vector<std::string>& saved) {
  std::vector<torch::serialize::InputArchive> archives(saved.size());
  for (size_t a = 0; a < saved.size(); ++a) {
    std::istringstream is(saved[a]);
    archives[a].load_from(is);
  }
  opt.load(archives);
}

// Saved at EP 2 (every rank its archive: each expert slice with its offset in the whole stack),
// loaded by one process holding every expert; saved by one process, loaded at EP 2. Both then
// continue exactly as the unsplit run (tolerance 0, as above).
TEST(ExpertParallel, CheckpointSavedAtEpTwoLoadsAtEpOneAndBack) {
  const Problem prob = make_problem(4, 31);
  for (const Mesh& m : {kEpIsDp, kEpBesideFs}) {
    for (const Algo& a : algorithms()) {
      const std::string what = std::string(m.name) + ", " + a.label;
      SCOPED_TRACE(what);
      Single unsplit(prob.params, a.options);
      unsplit.steps(prob, 0, 2);
      std::vector<at::Tensor> halfway;
      for (const auto& p : unsplit.params) halfway.push_back(p.clone());
      const std::string one_archive = save(*unsplit.opt);
      unsplit.steps(prob, 2, 4);

      // EP 2 -> EP 1.
      FakeWorld w(m.outer, m.inner);
      std::vector<Rank> ranks(static_cast<size_t>(w.size()));
      std::vector<std::string> archives(static_cast<size_t>(w.size()));
      w.run([&](int r) {
        Rank& k = ranks[static_cast<size_t>(r)];
        k = make_rank(w, m, r, prob.params, a.options);
        for (int t = 0; t < 2; ++t) step_rank(k, w, m, r, prob.grads[t]);
        archives[static_cast<size_t>(r)] = save(*k.opt);
      });
      std::vector<at::Tensor> at_two;
      for (size_t i = 0; i < kShapes.size(); ++i) at_two.push_back(whole(w, m, ranks, i));
      Single resumed(at_two, a.options);
      load(*resumed.opt, archives);
      resumed.steps(prob, 2, 4);
      for (size_t i = 0; i < kShapes.size(); ++i)
        EXPECT_TRUE(resumed.params[i].equal(unsplit.params[i])) << what << ": ep 2 -> 1, p" << i;

      // EP 1 -> EP 2.
      FakeWorld w2(m.outer, m.inner);
      std::vector<Rank> ranks2(static_cast<size_t>(w2.size()));
      w2.run([&](int r) {
        Rank& k = ranks2[static_cast<size_t>(r)];
        k = make_rank(w2, m, r, halfway, a.options);
        load(*k.opt, {one_archive});
        for (int t = 2; t < 4; ++t) step_rank(k, w2, m, r, prob.grads[t]);
      });
      expect_equal(w2, m, ranks2, unsplit.params, what + ": ep 1 -> 2");
    }
  }
}

}  // namespace
