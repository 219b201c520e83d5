// The algorithm registry (dion/optim/algorithm.h): the builtin algorithms in their order, a
// toy algorithm defined in one test-only file (sign_descent.cpp, linked into this binary)
// working through the C++ API like a builtin one, and the registry's errors.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cstdlib>

#include "dion/dion.h"
#include "dion/optim/algorithm.h"
#include "dion/optim/optimizer.h"

namespace {

TEST(Registry, BuiltinsInOrderThenTheTestsAlgorithm) {
  EXPECT_EQ(dion::algorithm_names(), "muon, normuon, dion2, nordion2, dion, adamw, lion, sign_descent");
  EXPECT_EQ(dion::algorithm_names(/*matrix_only=*/true), "muon, normuon, dion2, nordion2, dion, sign_descent");
  EXPECT_EQ(dion::find_algorithm("dion3"), dion::Algorithm{});
  EXPECT_EQ(dion::find_algorithm("dion3", /*aliases=*/true), dion::find_algorithm("nordion2"));
  EXPECT_FALSE(dion::find_algorithm("sgd"));
  EXPECT_THROW(dion::Algorithm{}.spec(), std::logic_error);
}

TEST(Registry, SignDescentStepEqualsItsFormula) {
  at::manual_seed(0);
  const at::Tensor W0 = at::randn({6, 4});
  const at::Tensor b0 = at::randn({4});
  at::Tensor W = W0.clone(), b = b0.clone();
  dion::NamedOptimizer opt("sign_descent", {{{W}}, {{b}, {.algorithm = "adamw"}}},
                           dion::NamedOptimizer::defaults_of("sign_descent").lr(0.1).mu(0.5).weight_decay(0.2), {},
                           nullptr);
  at::Tensor M = at::zeros_like(W0), expected = W0.clone();
  for (int step = 0; step < 3; ++step) {
    const at::Tensor G = at::randn({6, 4});
    W.mutable_grad() = G.clone();
    b.mutable_grad() = at::randn({4});
    opt.step();
    M = M * 0.5 + G;
    expected = expected * (1.0 - 0.1 * 0.2) - 0.1 * M.sign();
  }
  EXPECT_TRUE(at::allclose(W, expected, 1e-6, 1e-7)) << (W - expected).abs().max();
  EXPECT_TRUE(at::equal(opt.state_of(W)->momentum(), M.to(W.scalar_type())) ||
              at::allclose(opt.state_of(W)->momentum(), M, 1e-6, 1e-7));
  EXPECT_FALSE(b.equal(b0));  // the scalar group ran too
  // Its state table, through the generic API.
  const auto specs = opt.state_specs(W, opt.options(0));
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].key, "momentum");
}

TEST(Registry, SignDescentChecksAndCheckpoints) {
  // Its own option rule, in the library's message format.
  try {
    dion::Optimizer({{at::randn({4, 4})}}, dion::Options(0.1).algorithm("sign_descent").mu(1.0));
    FAIL() << "mu = 1 accepted";
  } catch (const dion::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("param group 0: invalid mu = 1 (must be < 1 for sign_descent)"),
              std::string::npos)
        << e.what();
  }
  // A matrix algorithm: vectors are refused, naming the scalar algorithms.
  EXPECT_THROW(dion::Optimizer({{at::randn({4})}}, dion::Options().algorithm("sign_descent")), dion::ValueError);
  // A checkpoint round trip restores its state.
  at::manual_seed(1);
  at::Tensor W = at::randn({5, 3});
  dion::Optimizer a({{W}}, dion::Options(0.05).algorithm("sign_descent"));
  W.mutable_grad() = at::randn({5, 3});
  a.step();
  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  at::Tensor W2 = W.clone();
  dion::Optimizer b({{W2}}, dion::Options(0.05).algorithm("sign_descent"));
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  b.load(in);
  EXPECT_TRUE(b.state_of(W2)->momentum().equal(a.state_of(W)->momentum()));
}

TEST(Registry, RegistrationErrors) {
  dion::AlgorithmSpec dup;
  dup.name = "muon";
  dup.state = [](const dion::ParamView&, const dion::Options&) { return std::vector<dion::StateSpec>{}; };
  dup.update = [](const dion::driver::Batch&, const dion::Options&, const dion::driver::Env&) {};
  EXPECT_THROW(dion::register_algorithm(dup), std::invalid_argument);
  dion::AlgorithmSpec alias = dup;
  alias.name = "fresh_name";
  alias.aliases = {"dion3"};  // taken by nordion2
  EXPECT_THROW(dion::register_algorithm(alias), std::invalid_argument);
  dion::AlgorithmSpec empty;
  empty.name = "no_update";
  EXPECT_THROW(dion::register_algorithm(empty), std::invalid_argument);
}

TEST(Registry, PluginErrorsNameThePath) {
  try {
    dion::load_algorithm_plugin("/nonexistent/libnothing.so");
    FAIL();
  } catch (const dion::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/libnothing.so': cannot be loaded"), std::string::npos);
  }
  // A shared library without the entry point (libc's math library).
  try {
    dion::load_algorithm_plugin("libm.so.6");
    FAIL();
  } catch (const dion::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("exports no dion_algorithm_plugin"), std::string::npos) << e.what();
  }
}

}  // namespace
