// The fused element-wise CPU kernels (dion/math/elementwise.h) against the ATen compositions they
// replace: every result must equal the composition's BIT FOR BIT, for every float32 / bfloat16
// combination of the operands, on shapes whose sizes are not multiples of any vector width (so
// the vectorized bodies and the scalar tails of ATen's kernels are both compared), and through
// the optimizer math that calls them (math::muon_pre / muon_post / lion_update / dion2_pre /
// dion2_post) against the same math on non-contiguous inputs, which take the ATen path.
//
// ctest runs this binary twice: under the machine's own ATen kernels (AVX512 here: lerp as an
// FMA) and under ATEN_CPU_CAPABILITY=default (the environment of the exact.* reference tests:
// lerp as a multiply and an add), so the kernels must follow ATen in both.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>

#include <tuple>
#include <vector>

#include "dion/math/dion2.h"
#include "dion/math/elementwise.h"
#include "dion/math/muon.h"
#include "dion/math/nordion2.h"
#include "dion/math/normuon.h"
#include "dion/math/ortho.h"
#include "dion/math/scalar.h"

namespace {

namespace cpu = dion::math::cpu;
using at::kBFloat16;
using at::kFloat;

at::Tensor f32(float v) { return at::scalar_tensor(v, at::kFloat); }

// Exact equality, NaN-free inputs: the largest difference must be 0.
void expect_identical(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  const double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  EXPECT_EQ(diff, 0.0) << what << ": max |fused - ATen| = " << diff;
  EXPECT_TRUE(at::equal(actual, expected)) << what;
}

at::Tensor rand_like_dtype(std::vector<int64_t> shape, at::ScalarType dt, double scale = 1.0) {
  return (at::randn(shape) * scale).to(dt);
}

// The same values in a column-major (non-contiguous) [m, n] tensor: the math's ATen branch.
at::Tensor strided(const at::Tensor& t) { return at::empty({t.size(1), t.size(0)}, t.options()).t().copy_(t); }

const std::vector<std::vector<int64_t>> kShapes = {{37, 129}, {64, 768}, {3, 5}};
const std::vector<at::ScalarType> kTypes = {kFloat, kBFloat16};

std::string name(at::ScalarType t) { return t == kFloat ? "f32" : "bf16"; }

TEST(Elementwise, MomentumEqualsAten) {
  at::manual_seed(1);
  for (const auto& shape : kShapes)
    for (at::ScalarType tm : kTypes)
      for (at::ScalarType tg : kTypes)
        for (at::ScalarType tu : kTypes)
          for (bool nesterov : {false, true}) {
            const std::string what =
                "M " + name(tm) + " G " + name(tg) + " U " + name(tu) + (nesterov ? " nesterov" : "");
            const at::Tensor M0 = rand_like_dtype(shape, tm), G = rand_like_dtype(shape, tg, 0.1);
            const float mu = 0.95f;
            at::Tensor M_ref = M0.clone();
            const at::Tensor g = G.to(tm);
            M_ref.mul_(f32(mu)).add_(g);
            const at::Tensor U_ref = (nesterov ? M_ref * f32(mu) + g : M_ref).to(tu);
            at::Tensor M = M0.clone(), U = at::empty(shape, at::TensorOptions().dtype(tu));
            cpu::momentum_(M, G, U, mu, nesterov);
            expect_identical(M, M_ref, what + ": M");
            expect_identical(U, U_ref, what + ": U");
          }
}

TEST(Elementwise, DecayAndUpdateEqualsAten) {
  at::manual_seed(2);
  const float lr = 0.02f, wd = 0.1f, adj = 0.0137f;
  for (const auto& shape : kShapes)
    for (at::ScalarType tx : kTypes)
      for (at::ScalarType tu : kTypes) {
        const std::string what = "X " + name(tx) + " U " + name(tu);
        const at::Tensor X0 = rand_like_dtype(shape, tx), U = rand_like_dtype(shape, tu);
        // Muon: X.mul_(decay); X.sub_(U * adj)
        at::Tensor X_ref = X0.clone();
        X_ref.mul_(f32(1.0f - lr * wd));
        X_ref.sub_(U * f32(adj));
        at::Tensor X = X0.clone();
        cpu::decay_and_update_(X, U, 1.0f - lr * wd, -adj, false);
        expect_identical(X, X_ref, what + " (muon)");
        // Dion2: X.mul_(decay); X.add_(U.to(X) * (-adj))
        X_ref = X0.clone();
        X_ref.mul_(f32(1.0f - lr * wd));
        X_ref.add_(U.to(tx) * f32(-adj));
        X = X0.clone();
        cpu::decay_and_update_(X, U, 1.0f - lr * wd, -adj, true);
        expect_identical(X, X_ref, what + " (dion2)");
      }
}

// The orthogonalizers' steps as src/math/ortho.cpp writes them, with double coefficients (the
// Newton-Schulz ones, and large and tiny ones that round differently in bf16), batched too.
TEST(Elementwise, ScaledAddEqualsAten) {
  at::manual_seed(5);
  const std::vector<std::array<double, 3>> coeffs = {
      {3.4445, -4.7750, 2.0315}, {8.28721201814563, -23.595886519098837, 17.300387312530933}, {1e-3, 7e5, -0.1}};
  std::vector<std::vector<int64_t>> shapes = kShapes;
  shapes.push_back({3, 33, 17});
  for (const auto& shape : shapes)
    for (at::ScalarType t : kTypes)
      for (const auto& k : coeffs) {
        const std::string what = name(t) + " a " + std::to_string(k[0]);
        const at::Tensor X = rand_like_dtype(shape, t, 3.0), P = rand_like_dtype(shape, t, 5.0);
        at::Tensor Y = P.clone();
        cpu::scaled_add_(X, float(k[1]), Y, float(k[2]), true);
        expect_identical(Y, X * k[1] + P * k[2], what + " (b A + c A^2)");
        Y = P.clone();
        cpu::scaled_add_(X, float(k[0]), Y, 1.0f, false);
        expect_identical(Y, X * k[0] + P, what + " (a X + B X)");
      }
}

TEST(Elementwise, LionEqualsAten) {
  at::manual_seed(3);
  const dion::math::LionHyper h{0.0003f, 0.9f, 0.99f, 0.1f, false};
  for (const auto& shape : std::vector<std::vector<int64_t>>{{37, 129}, {100003}, {64, 768}})
    for (at::ScalarType tx : kTypes)
      for (at::ScalarType tm : kTypes) {
        const std::string what = "X " + name(tx) + " M " + name(tm);
        const at::Tensor X0 = rand_like_dtype(shape, tx), G = rand_like_dtype(shape, tm, 0.01),
                         M0 = rand_like_dtype(shape, tm, 0.01);
        // The ATen composition (math::lion_update's fallback), written out.
        at::Tensor X_ref = X0.clone(), M_ref = M0.clone();
        const at::Tensor g = G.to(tm);
        at::Tensor U = at::lerp(M_ref, g, f32(1.0f - h.beta1)).sign_();
        M_ref.lerp_(g, f32(1.0f - h.beta2));
        X_ref.mul_(f32(1.0f - h.lr * h.weight_decay));
        X_ref.sub_(U.mul_(f32(h.lr)));
        at::Tensor X = X0.clone(), M = M0.clone();
        cpu::lion_(X, G, M, h.lr, h.beta1, h.beta2, h.weight_decay);
        expect_identical(M, M_ref, what + ": M");
        expect_identical(X, X_ref, what + ": X");
        // And through math::lion_update (fused) against it on non-contiguous views (ATen path).
        at::Tensor X2 = X0.clone(), M2 = M0.clone();
        dion::math::lion_update({X2}, {G}, {M2}, h);
        expect_identical(X2, X_ref, what + ": lion_update X");
        if (shape.size() == 2) {
          at::Tensor Xt = strided(X0), Mt = strided(M0), Gt = strided(G);  // strided
          ASSERT_FALSE(Xt.is_contiguous());
          dion::math::lion_update({Xt}, {Gt}, {Mt}, h);
          expect_identical(Xt.contiguous(), X_ref, what + ": ATen path X");
          expect_identical(Mt.contiguous(), M_ref, what + ": ATen path M");
        }
      }
}

TEST(Elementwise, L1NormsEqualAten) {
  at::manual_seed(4);
  for (const auto& shape : kShapes)
    for (at::ScalarType tm : kTypes)
      for (at::ScalarType tg : kTypes)
        for (int64_t select_dim : {-2, -1}) {
          const std::string what = "M " + name(tm) + " G " + name(tg) + " select_dim " + std::to_string(select_dim);
          const at::Tensor M0 = rand_like_dtype(shape, tm), G = rand_like_dtype(shape, tg, 0.1);
          at::Tensor M_ref = M0.clone();
          M_ref.add_(G.to(tm));
          const int64_t norm_dim = select_dim == -2 ? -1 : -2;
          // As dion2_pre's ATen branch: the norm of the stacked batch [1, m, n].
          const at::Tensor n_ref = at::linalg_vector_norm(M_ref.unsqueeze(0), 1, at::IntArrayRef{norm_dim}, false)[0];
          at::Tensor M = M0.clone(), norms = at::empty({M0.size(select_dim)}, M0.options());
          cpu::accumulate_l1_norms_(M, G, norms, select_dim);
          expect_identical(M, M_ref, what + ": M");
          expect_identical(norms, n_ref, what + ": norms");
        }
}

TEST(Elementwise, SelectionAndPostEqualAten) {
  at::manual_seed(5);
  for (const auto& shape : kShapes)
    for (at::ScalarType tm : kTypes)
      for (at::ScalarType tu : kTypes)
        for (int64_t select_dim : {-2, -1}) {
          const std::string what = "M/X " + name(tm) + " U " + name(tu) + " select_dim " + std::to_string(select_dim);
          const int64_t size = shape[select_dim == -2 ? 0 : 1];
          const int64_t k = std::max<int64_t>(1, size / 4);
          const at::Tensor idx = at::randperm(size, at::kLong).narrow(0, 0, k);
          const at::Tensor M0 = rand_like_dtype(shape, tm);
          const float ef = 0.95f;
          // take_selected_ against gather + scatter_ (dion2_pre's ATen branch)
          at::Tensor M_ref = M0.clone();
          const at::Tensor sel = M_ref.index_select(select_dim, idx);
          M_ref.index_copy_(select_dim, idx, sel * f32(ef));
          at::Tensor M = M0.clone();
          std::vector<int64_t> ushape = shape;
          ushape[select_dim == -2 ? 0 : 1] = k;
          at::Tensor U = at::empty(ushape, at::TensorOptions().dtype(tu));
          cpu::take_selected_(M, idx, U, ef, select_dim);
          expect_identical(U, sel.to(tu), what + ": U");
          expect_identical(M, M_ref, what + ": M");
          // decay_and_update_selected_ against math::dion2_post on a strided X (its ATen branch)
          const float lr = 0.02f, adj = 0.013f, wd = 0.1f;
          at::Tensor X_ref = strided(M0);
          dion::math::dion2_post({X_ref}, {U}, {idx}, lr, adj, wd, select_dim);
          at::Tensor X = M0.clone();
          cpu::decay_and_update_selected_(X, U, idx, 1.0f - lr * wd, -adj, select_dim);
          expect_identical(X, X_ref.contiguous(), what + ": X");
        }
}

TEST(Elementwise, AddAndCopyEqualsAten) {
  at::manual_seed(9);
  for (const auto& shape : kShapes)
    for (at::ScalarType tm : kTypes)
      for (at::ScalarType tg : kTypes)
        for (bool transpose : {false, true}) {
          const std::string what = "M " + name(tm) + " G " + name(tg) + (transpose ? " transposed" : "");
          const at::Tensor M0 = rand_like_dtype(shape, tm), G = rand_like_dtype(shape, tg, 0.1);
          at::Tensor M_ref = M0.clone();
          M_ref.add_(G);  // legacy Dion: G is not cast to M's dtype first
          const at::Tensor out_ref = at::stack({transpose ? M_ref.mT() : M_ref}, 0)[0];
          at::Tensor M = M0.clone(), out = at::empty(out_ref.sizes(), M0.options());
          cpu::add_and_copy_(M, G, out, transpose);
          expect_identical(M, M_ref, what + ": M");
          expect_identical(out, out_ref, what + ": out");
        }
}

// dion2_pre's fused branch (contiguous 2-D matrices) against its ATen branch (the same matrices
// as strided views): the same selection, U, M.
TEST(Elementwise, Dion2PreFusedEqualsAtenBranch) {
  at::manual_seed(6);
  for (const auto& shape : kShapes)
    for (at::ScalarType tm : kTypes)
      for (int64_t select_dim : {-2, -1}) {
        const std::string what = "M " + name(tm) + " select_dim " + std::to_string(select_dim);
        std::vector<at::Tensor> M_fused, M_aten, G;
        for (int i = 0; i < 3; ++i) {
          const at::Tensor m = rand_like_dtype(shape, tm);
          M_fused.push_back(m.clone());
          M_aten.push_back(strided(m));
          G.push_back(rand_like_dtype(shape, kFloat, 0.1));
        }
        auto a = dion::math::dion2_pre(G, M_fused, 0.25, 0.9f, select_dim, kBFloat16);
        auto b = dion::math::dion2_pre(G, M_aten, 0.25, 0.9f, select_dim, kBFloat16);
        for (size_t i = 0; i < M_fused.size(); ++i) {
          expect_identical(a.indices[i], b.indices[i], what + ": indices");
          expect_identical(a.U[i], b.U[i], what + ": U");
          expect_identical(M_fused[i], M_aten[i].contiguous(), what + ": M");
        }
        // The fused branch's U arrive as one buffer: stacked without a copy.
        const at::Tensor stacked = dion::math::stack_megabatch(a.U);
        EXPECT_EQ(stacked.data_ptr(), a.U[0].data_ptr()) << what;
        expect_identical(stacked, at::stack(b.U, 0), what + ": stacked");
      }
}

// The same for 3-D stacks (an MoE's experts [E, m, n]): each matrix of a stack is selected and
// updated apart, in the fused branch as in the ATen one (the same stacks with their last two dims
// transposed in memory), and dion2_post's fused branch equals its ATen branch too.
TEST(Elementwise, Dion2FusedOnExpertStacksEqualsAtenBranch) {
  at::manual_seed(16);
  auto strided3 = [](const at::Tensor& t) {  // non-contiguous: the ATen branch
    return at::empty({t.size(0), t.size(2), t.size(1)}, t.options()).transpose(1, 2).copy_(t);
  };
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 37, 29}, std::vector<int64_t>{2, 5, 130}})
    for (at::ScalarType tm : kTypes)
      for (int64_t select_dim : {-2, -1}) {
        const std::string what = "stack " + std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + "x" +
                                 std::to_string(shape[2]) + " M " + name(tm) + " select_dim " +
                                 std::to_string(select_dim);
        std::vector<at::Tensor> M_fused, M_aten, G, X_fused, X_aten;
        for (int i = 0; i < 2; ++i) {
          const at::Tensor m = rand_like_dtype(shape, tm), x = rand_like_dtype(shape, tm);
          M_fused.push_back(m.clone());
          M_aten.push_back(strided3(m));
          X_fused.push_back(x.clone());
          X_aten.push_back(strided3(x));
          G.push_back(rand_like_dtype(shape, kFloat, 0.1));
        }
        auto a = dion::math::dion2_pre(G, M_fused, 0.25, 0.9f, select_dim, kFloat);
        auto b = dion::math::dion2_pre(G, M_aten, 0.25, 0.9f, select_dim, kFloat);
        for (size_t i = 0; i < M_fused.size(); ++i) {
          ASSERT_EQ(a.indices[i].dim(), 2) << what;  // [E, k]: one selection per matrix
          expect_identical(a.indices[i], b.indices[i], what + ": indices");
          expect_identical(a.U[i], b.U[i], what + ": U");
          expect_identical(M_fused[i], M_aten[i].contiguous(), what + ": M");
        }
        dion::math::dion2_post(X_fused, a.U, a.indices, 0.02f, 0.013f, 0.1f, select_dim);
        dion::math::dion2_post(X_aten, b.U, b.indices, 0.02f, 0.013f, 0.1f, select_dim);
        for (size_t i = 0; i < X_fused.size(); ++i)
          expect_identical(X_fused[i], X_aten[i].contiguous(), what + ": X");
      }
}

// muon_pre writes the megabatch into one buffer (so stack_megabatch is a view), and muon_post
// equals its ATen branch.
TEST(Elementwise, MuonPreAndPostThroughTheMath) {
  at::manual_seed(7);
  for (at::ScalarType tm : kTypes) {
    std::vector<at::Tensor> M_fused, M_aten, G, X_fused, X_aten;
    for (int i = 0; i < 3; ++i) {
      const at::Tensor m = rand_like_dtype({48, 80}, tm), x = rand_like_dtype({48, 80}, tm);
      M_fused.push_back(m.clone());
      M_aten.push_back(strided(m));
      X_fused.push_back(x.clone());
      X_aten.push_back(strided(x));
      G.push_back(rand_like_dtype({48, 80}, kFloat, 0.1));
    }
    const auto U_fused = dion::math::muon_pre(G, M_fused, 0.95f, true, kBFloat16);
    const auto U_aten = dion::math::muon_pre(G, M_aten, 0.95f, true, kBFloat16);
    const at::Tensor stacked = dion::math::stack_megabatch(U_fused);
    EXPECT_EQ(stacked.data_ptr(), U_fused[0].data_ptr());
    expect_identical(stacked, at::stack(U_aten, 0), "muon_pre U " + name(tm));
    for (size_t i = 0; i < M_fused.size(); ++i) expect_identical(M_fused[i], M_aten[i].contiguous(), "muon_pre M");
    dion::math::muon_post(X_fused, U_fused, 0.02f, 0.013f, 0.1f, false);
    dion::math::muon_post(X_aten, U_fused, 0.02f, 0.013f, 0.1f, false);
    for (size_t i = 0; i < X_fused.size(); ++i)
      expect_identical(X_fused[i], X_aten[i].contiguous(), "muon_post X " + name(tm));
  }
}

// The FAST path's fused NorMuon / NorDion2 normalization + update against the exact composition
// (normuon_normalize + muon_post; nordion2_normalize_selected + dion2_post). Not bit-identical:
// its sums run in double in another order than ATen's mean and Frobenius norms. Measured:
// X within 6.8e-8 of the largest |X| (one float32 ulp of 1 is 1.2e-7), V within 8.3e-8
// relative: tolerances 5e-7 (X) and 1e-6 (V), a few ulps, far below a bf16 ulp (7.8e-3).
double rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  return (ad - bd).abs().max().item<double>() / bd.abs().max().item<double>();
}

TEST(Elementwise, NormuonUpdateFastMatchesComposition) {
  at::manual_seed(8);
  const float beta2 = 0.95f, lr = 0.02f, adj = 0.05f, wd = 0.1f;
  for (bool selected : {false, true}) {
    const int64_t m = 48, n = 80, N = 3, k = selected ? 12 : m;
    std::vector<at::Tensor> X, V, idx;
    for (int64_t i = 0; i < N; ++i) {
      X.push_back(at::randn({m, n}));
      V.push_back(at::rand({m, 1}) * 1e-3);
      idx.push_back(at::randperm(m, at::kLong).narrow(0, 0, k));
    }
    const at::Tensor O = at::randn({N, k, n}).to(kBFloat16) * 0.1;
    std::vector<at::Tensor> X_ref, V_ref;
    for (int64_t i = 0; i < N; ++i) {
      X_ref.push_back(X[static_cast<size_t>(i)].clone());
      V_ref.push_back(V[static_cast<size_t>(i)].clone());
    }
    if (selected) {
      auto [normed, V_new] = dion::math::nordion2_normalize_selected(O, at::stack(V_ref, 0), at::stack(idx, 0), beta2);
      for (int64_t i = 0; i < N; ++i) V_ref[static_cast<size_t>(i)].copy_(V_new[i]);
      dion::math::dion2_post(X_ref, normed.unbind(0), idx, lr, adj, wd, -2);
    } else {
      auto [normed, V_new] = dion::math::normuon_normalize(O, at::stack(V_ref, 0), beta2);
      for (int64_t i = 0; i < N; ++i) V_ref[static_cast<size_t>(i)].copy_(V_new[i]);
      dion::math::muon_post(X_ref, normed.unbind(0), lr, adj, wd, false);
    }
    ASSERT_TRUE(dion::math::normuon_update_fast(X, O, V, selected ? at::TensorList(idx) : at::TensorList(), beta2, lr,
                                                adj, wd));
    for (int64_t i = 0; i < N; ++i) {
      const size_t j = static_cast<size_t>(i);
      const double dx = rel(X[j], X_ref[j]), dv = rel(V[j], V_ref[j]);
      EXPECT_LE(dx, 5e-7) << (selected ? "NorDion2" : "NorMuon") << " X " << i;
      EXPECT_LE(dv, 1e-6) << (selected ? "NorDion2" : "NorMuon") << " V " << i;
      std::printf("%s matrix %lld: X %.2e, V %.2e\n", selected ? "NorDion2" : "NorMuon", static_cast<long long>(i), dx,
                  dv);
    }
  }
  // Not fusable (a strided X): nothing changed, false.
  std::vector<at::Tensor> Xs = {strided(at::randn({8, 8}))}, Vs = {at::zeros({8, 1})};
  const at::Tensor before = Xs[0].clone();
  EXPECT_FALSE(dion::math::normuon_update_fast(Xs, at::randn({1, 8, 8}), Vs, {}, beta2, lr, adj, wd));
  EXPECT_TRUE(at::equal(Xs[0], before));
}

TEST(Elementwise, StackMegabatchCopiesUnrelatedTensors) {
  const at::Tensor a = at::randn({4, 5}), b = at::randn({4, 5});
  const at::Tensor s = dion::math::stack_megabatch({a, b});
  EXPECT_NE(s.data_ptr(), a.data_ptr());
  expect_identical(s, at::stack({a, b}, 0), "stack");
  const at::Tensor base = at::randn({3, 4, 5});
  const at::Tensor v = dion::math::stack_megabatch({base[0], base[1], base[2]});
  EXPECT_EQ(v.data_ptr(), base.data_ptr());
  // Out of order: a copy in the given order.
  const at::Tensor r = dion::math::stack_megabatch({base[1], base[0]});
  expect_identical(r, at::stack({base[1], base[0]}, 0), "reordered");
}

TEST(Elementwise, BadArgumentsAreNamed) {
  const at::Tensor M = at::randn({4, 6}), G = at::randn({4, 6});
  try {
    cpu::take_selected_(M, at::tensor({0, 9}, at::kLong), at::empty({2, 6}), 0.9f, -2);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 9 out of range [0, 4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::accumulate_l1_norms_(M, G, at::empty({4}), 0), c10::Error);
  EXPECT_THROW(cpu::momentum_(M, at::randn({5}), at::Tensor(), 0.9f, false), c10::Error);
  EXPECT_FALSE(cpu::cpu_fusable(M.t(), G));
  EXPECT_FALSE(cpu::cpu_fusable(M.to(at::kDouble), G));
}

}  // namespace
