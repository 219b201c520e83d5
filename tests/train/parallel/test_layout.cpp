// Who holds which part (dion/train/layout.h), on the GPT's own parameters with an MoE: at every
// mesh shape the counting ranks' parts tile each tensor exactly once, every other rank holds a
// copy of one of them, and meta.json's fields give the placement back.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dion/train/gpt.h"
#include "dion/train/layout.h"

namespace dion::train {
namespace {

// Two blocks: a dense MLP, then an MoE (4 experts, a shared expert); 24 along vocab and heads
// of 8 split evenly at tp 2 and unevenly at fs 3.
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_params() {
  GPTConfig c{16, 24, 2, 2, 16};
  c.moe = MoEConfig{4, 2, 8, 1, 2};
  c.placeholder_weights = true;
  GPT model(c);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : model->named_parameters()) out.push_back({item.key(), item.value().sizes().vec()});
  return out;
}

std::string text(const MeshShape& m) {
  return "dp " + std::to_string(m.dp) + " x fs " + std::to_string(m.fs) + " x tp " + std::to_string(m.tp) + " ep " +
         std::to_string(m.ep);
}

const std::vector<MeshShape> kShapes = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {1, 3, 1, 1}, {1, 1, 2, 1},
                                        {2, 2, 2, 1}, {1, 2, 1, 2}, {2, 1, 1, 2}, {1, 4, 1, 2}, {2, 4, 1, 2},
                                        {2, 2, 2, 2}, {1, 4, 2, 4}, {1, 4, 2, 2}};

TEST(Layout, TheCountingRanksTileEveryParameterOnceAndTheOthersHoldCopies) {
  const auto params = gpt_params();
  for (const MeshShape& m : kShapes) {
    const Layout L(m);
    for (const auto& [name, shape] : params) {
      SCOPED_TRACE(text(m) + ", " + name);
      const Placement p = L.place(name, shape);
      at::Tensor seen = at::zeros(shape, at::kInt);
      const at::Tensor whole = at::arange(seen.numel(), at::kFloat).reshape(shape);
      std::vector<at::Tensor> counted_parts;
      for (int r : L.owners(p)) {
        const Box b = L.box(p, r);
        at::Tensor v = seen;
        for (size_t d = 0; d < b.start.size(); ++d) v = v.narrow(int64_t(d), b.start[d], b.length[d]);
        v.add_(1);
        counted_parts.push_back(L.part(whole, p, r));
      }
      EXPECT_TRUE(seen.eq(1).all().item<bool>()) << "covered " << seen.min().item<int>() << ".."
                                                 << seen.max().item<int>() << " times";
      for (int r = 0; r < L.world_size(); ++r) {
        const at::Tensor mine = L.part(whole, p, r);
        EXPECT_EQ(mine.sizes().vec(), L.box(p, r).length);
        bool copy = false;
        for (const at::Tensor& c : counted_parts) copy = copy || (c.sizes() == mine.sizes() && c.equal(mine));
        EXPECT_TRUE(copy) << "rank " << r << " holds a part no counting rank holds";
      }
    }
  }
}

TEST(Layout, ReplicasLiveOverDpForDenseParametersAndOverEdpForExpertStacks) {
  const Layout L({2, 2, 2, 2});  // data ranks 0..3, ep 2: edp index = data / 2
  const Placement experts = L.place("transformer.h.1.mlp.experts.w1", {4, 8, 16});
  const Placement dense = L.place("transformer.h.1.mlp.router.weight", {4, 16});
  EXPECT_EQ(L.replica_axis(experts), ReplicaAxis::edp);
  EXPECT_EQ(L.replica_axis(dense), ReplicaAxis::dp);
  // Ranks (data d, tp t) = d * 2 + t: the experts are counted on tp rank 0 of data ranks 0 and 1
  // (ep ranks 0 and 1 of the first edp replica); the router on tp rank 0 of fs ranks 0 and 1 at dp 0.
  EXPECT_EQ(L.owners(experts), (std::vector<int>{0, 2}));
  EXPECT_EQ(L.owners(dense), (std::vector<int>{0, 2}));
  EXPECT_TRUE(L.tp_copy(experts, 1));
  EXPECT_FALSE(L.tp_copy(L.place("transformer.h.0.attn.c_q.weight", {16, 16}), 1));
  const MeshCoord c = L.coord(6);  // data 3: dp 1, fs 1, ep 1, edp 1
  EXPECT_EQ((std::vector<int64_t>{c.dp, c.fs, c.tp, c.data, c.ep, c.edp}), (std::vector<int64_t>{1, 1, 0, 3, 1, 1}));
}

TEST(Layout, MetaJsonFieldsGiveThePlacementBack) {
  for (const MeshShape& m : kShapes) {
    const Layout L(m);
    for (const auto& [name, shape] : gpt_params()) {
      const Placement p = L.place(name, shape);
      Placement q{p.name, p.global_shape};
      for (const SplitField& f : split_fields())
        if (f.always || p.*f.field != f.unsplit) q.*f.field = p.*f.field;
      for (int r = 0; r < L.world_size(); ++r) {
        EXPECT_EQ(L.box(q, r).start, L.box(p, r).start) << text(m) << ", " << name;
        EXPECT_EQ(L.box(q, r).length, L.box(p, r).length) << text(m) << ", " << name;
      }
    }
  }
}

TEST(Layout, AParameterThePlanDoesNotKnowIsALogicError) {
  EXPECT_THROW(Layout({1, 2, 1, 1}).place("transformer.h.0.attn.bias", {16}), std::logic_error);
}

}  // namespace
}  // namespace dion::train
