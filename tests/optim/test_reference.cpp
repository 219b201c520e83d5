// Reference vectors: dion-cpp against microsoft/dion, step by step.
//
// Each tests/vectors/reference/<case>.safetensors was recorded by tests/reference/make_vectors.py
// running the reference optimizer on CPU (one process, torch.compile off). This test rebuilds
// the same optimizer from the case's metadata, feeds the same gradients, and after every step
// compares every parameter and every state tensor.
//
// Exactness. The reference's result is reproducible bit for bit only by the same kernels, and
// several of LibTorch's CPU kernels are chosen per CPU: ATen's vectorized kernels (AVX512 / AVX2 /
// scalar), oneDNN's bf16 GEMMs (AMX / AVX512-BF16 / AVX512 / AVX2), MKL's code path (its BLAS,
// LAPACK and vector math: torch.sqrt is MKL's vsSqrt), and the thread count. The vectors were
// recorded with all of them pinned (support/exact_env.h: ATEN_CPU_CAPABILITY=default, oneDNN off,
// MKL_CBWR=COMPATIBLE, one thread) and record that environment in their metadata. When this
// process runs in it every parameter and state tensor must match EXACTLY (max |diff| == 0, legacy
// Dion's Q included, no sign alignment): ctest's exact.* tests (DION_REF_EXACT=1 makes the binary
// pin the kernels itself, and an environment that still differs a failure, not a fallback), again
// on emulated CPUs (exact_cpu_avx2.*, exact_cpu_nonintel.*: tests/CMakeLists.txt).
//
// In any other environment (the plain tests: the machine's own kernels, oneDNN on, LibTorch's
// default thread count) the comparison uses tolerances, relative to the largest magnitude of the
// expected tensor. They are derived for a CPU other than the recording one, and checked on this
// Intel Xeon (AVX512-FP16, no AMX) natively, with ATen at AVX2, oneDNN capped at AVX512_CORE /
// AVX512_CORE_BF16 / AVX2, MKL at AVX2 or on its non-Intel paths, and at 2 threads (worst seen in
// brackets, over all 30 cases and those 8 environments):
//   - bf16 tensors: 1e-2, one bf16 ulp (2^-7) of an element near the largest [8.1e-3].
//   - cases that orthogonalize in bf16 (Muon, NorMuon, Dion2, NorDion2 / Dion3: the reference's
//     Newton-Schulz / Polar Express run in bf16): another GEMM kernel accumulates in another order
//     and can flip a bf16 rounding of the update O, by 2^-8 of |O|max <= 1. One flip moves a
//     parameter by lr_adj * 2^-8 <= 0.0283 * 2^-8 = 1.1e-4 (lr <= 0.02, times sqrt(2) for the
//     32x16 shapes), 7.7e-5 of the smallest max |p| of these cases (1.44); five steps with a flip
//     each stay under 3.9e-4: tolerance 5e-4 for their fp32 tensors [1.3e-5, NorMuon p3, from
//     oneDNN's AVX512-BF16 kernel for a 24x24 GEMM]. NorMuon / NorDion2's variance_neuron is
//     the EMA of each row's mean of O^2: a flip changes an element of O^2 by 2 * 2^-8 relative,
//     and a row mean dominated by one element as much: tolerance 1e-2 [1.2e-4].
//   - legacy Dion (fp32 power iteration, MKL's GEMM and QR): fp32 tensors 1e-6, about eight fp32
//     ulps (2^-23 = 1.2e-7) after 5 steps [1.8e-7]; its Q 1e-4, an fp32 QR / Cholesky QR whose
//     rounding P's conditioning amplifies, compared up to the sign of each column (a QR factor is
//     unique only up to column signs, and another LAPACK path may pick other signs) [3.9e-5]; fp32
//     tensors of its bf16 (mixed-precision) case 1e-4: a flipped bf16 rounding of the state moves
//     them by lr times that ulp [2.6e-5].
//   - legacy Dion's initial Q: randn draws other numbers with another instruction set, so the
//     recorded Q is loaded instead of compared.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "dion/dion.h"
#include "exact_env.h"
#include "safetensors.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// "p" + i + ".s3" without GCC 12's -Warray-bounds false positive on operator+(const char*, string&&).
std::string key(const char* prefix, size_t i, const std::string& suffix) {
  std::string k(prefix);
  k += std::to_string(i);
  k += suffix;
  return k;
}

std::string reference_dir() { return std::string(DION_SOURCE_DIR) + "/tests/vectors/reference"; }

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(reference_dir()))
    if (e.path().extension() == ".safetensors") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The reference's constructor keyword arguments and group keys, onto our Options / Override.
void apply_ctor(dion::Options& o, const json& ctor, dion::math::OrthoConfig& ortho) {
  for (const auto& [k, v] : ctor.items()) {
    if (k == "lr")
      o.lr(v.get<double>());
    else if (k == "mu")
      o.mu(v.get<double>());
    else if (k == "weight_decay")
      o.weight_decay(v.get<double>());
    else if (k == "nesterov")
      o.nesterov(v.get<bool>());
    else if (k == "cautious_wd")
      o.cautious_wd(v.get<bool>());
    else if (k == "flatten")
      o.flatten(v.get<bool>());
    else if (k == "muon_beta2")
      o.muon_beta2(v.get<double>());
    else if (k == "fraction")
      o.fraction(v.get<double>());
    else if (k == "ef_decay")
      o.ef_decay(v.get<double>());
    else if (k == "rank_fraction")
      o.rank_fraction(v.get<double>());
    else if (k == "rank_multiple_of")
      o.rank_multiple_of(v.get<int64_t>());
    else if (k == "adjust_lr")
      o.adjust_lr(v.is_null() ? std::string("none") : v.get<std::string>());
    else if (k == "use_polar_express")
      ortho.method = v.get<bool>() ? dion::math::OrthoMethod::POLAR_EXPRESS : dion::math::OrthoMethod::NEWTON_SCHULZ;
    else if (k == "mixed_precision")
      o.momentum_dtype(at::kBFloat16).Q_dtype(at::kBFloat16);
    else
      FAIL() << "unknown constructor argument in case: " << k;
  }
}

dion::Override group_override(const json& opts) {
  dion::Override ov;
  for (const auto& [k, v] : opts.items()) {
    if (k == "algorithm")
      ov.algorithm = v.get<std::string>();
    else if (k == "lr")
      ov.lr = v.get<double>();
    else if (k == "cautious_wd")
      ov.cautious_wd = v.get<bool>();
    else if (k == "num_heads")
      ov.num_heads = v.get<int64_t>();
    else if (k == "split_sizes")
      ov.split_sizes = v.get<std::vector<int64_t>>();
    else if (k == "weight_decay")
      ov.weight_decay = v.get<double>();
    else
      ADD_FAILURE() << "unknown group option in case: " << k;
  }
  return ov;
}

std::unique_ptr<dion::Optimizer> make_optimizer(const std::string& cls, const json& c,
                                                const std::vector<at::Tensor>& params) {
  dion::math::OrthoConfig ortho;
  dion::Options defaults;
  if (cls == "Muon")
    defaults = dion::Muon::defaults();
  else if (cls == "NorMuon")
    defaults = dion::NorMuon::defaults();
  else if (cls == "Dion2")
    defaults = dion::Dion2::defaults();
  else if (cls == "NorDion2" || cls == "Dion3")
    defaults = dion::Dion3::defaults();
  else if (cls == "Dion")
    defaults = dion::Dion::defaults();
  apply_ctor(defaults, c["ctor"], ortho);
  std::vector<dion::ParamGroup> groups;
  for (const auto& g : c["groups"]) {
    dion::ParamGroup pg;
    for (int i : g["params"]) pg.params.push_back(params[i]);
    pg.options = group_override(g["options"]);
    groups.push_back(pg);
  }
  if (cls == "Muon") return std::make_unique<dion::Muon>(groups, defaults, ortho);
  if (cls == "NorMuon") return std::make_unique<dion::NorMuon>(groups, defaults, ortho);
  if (cls == "Dion2") return std::make_unique<dion::Dion2>(groups, defaults, ortho);
  if (cls == "NorDion2" || cls == "Dion3") return std::make_unique<dion::Dion3>(groups, defaults, ortho);
  if (cls == "Dion") return std::make_unique<dion::Dion>(groups, defaults);
  return nullptr;
}

struct Diff {
  double max_abs = 0, scale = 0;
  double rel() const { return scale > 0 ? max_abs / scale : max_abs; }
};

Diff diff(const at::Tensor& actual, const at::Tensor& expected) {
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  Diff d;
  d.max_abs = (a - e).abs().max().item<double>();
  d.scale = e.abs().max().item<double>();
  return d;
}

// Flip each column of `actual` to the sign of `expected`'s column (QR sign freedom).
at::Tensor align_columns(const at::Tensor& actual, const at::Tensor& expected) {
  at::Tensor dot = (actual.to(at::kDouble) * expected.to(at::kDouble)).sum(0, true);
  return actual.to(at::kDouble) * at::where(dot < 0, -1.0, 1.0);
}

at::Tensor state_tensor(const dion::ParamState& s, const std::string& key) {
  if (key == "momentum") return s.momentum();
  if (key == "variance") return s.variance();
  if (key == "variance_neuron") return s.variance_neuron();
  if (key == "Q") return s.Q();
  if (key == "step_dev") return s.step_dev();
  return {};
}

// DION_REF_EXACT=1: pin the kernels before ATen, MKL and oneDNN choose theirs (they read their
// variables at their first call, after static initialization); DION_TEST_ENV emulates another
// CPU (support/exact_env.h).
const bool kPinned = [] {
  dion::testing::apply_test_env();
  if (!std::getenv("DION_REF_EXACT")) return false;
  dion::testing::pin_exact_environment_variables();
  return true;
}();

// Whether this process runs the kernels the case was recorded with (see the top of the file);
// `why` says what differs.
bool exact_environment(const json& c, std::string& why) {
  why = dion::testing::exact_environment_differs(c);
  return why.empty();
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, MatchesStepByStep) {
  const auto st = dion::testing::load_safetensors(reference_dir() + "/" + GetParam() + ".safetensors");
  const json c = json::parse(st.metadata.at("case"));
  if (kPinned) dion::testing::pin_exact_environment_switches();
  // bf16 parameters or mixed-precision state feed fp32 tensors through bf16 roundings.
  const bool bf16_state = c["dtype"] == "bfloat16" || c["ctor"].contains("mixed_precision");
  // Every class but legacy Dion orthogonalizes in bf16 (see the top of the file).
  const bool bf16_ortho = c["optimizer"] != "Dion";
  std::string why;
  bool exact = exact_environment(c, why);
  if (!exact && std::getenv("DION_REF_EXACT"))
    FAIL() << "DION_REF_EXACT is set but this environment cannot reproduce the vectors bit for bit: " << why;
  // The pins took, but this CPU's sqrt may round otherwise than the recording's (exact_env.h):
  // then the classes whose step takes a square root compare with tolerances; the others stay
  // bit for bit.
  const std::string cls = c["optimizer"];
  const bool takes_sqrt = cls == "NorMuon" || cls == "NorDion2" || cls == "Dion3" || cls == "Dion";
  if (exact && takes_sqrt) {
    static const std::string unreachable = dion::testing::exact_unreachable_here();
    if (!unreachable.empty()) {
      why = unreachable;
      exact = false;
    }
  }
  const size_t n = c["shapes"].size();
  const int steps = c["steps"];

  std::vector<at::Tensor> params;
  for (size_t i = 0; i < n; ++i) params.push_back(st.at(key("p", i, ".init")).clone());

  at::manual_seed(c["seed"].get<int64_t>() + 1000);
  auto opt = make_optimizer(c["optimizer"], c, params);
  ASSERT_TRUE(opt) << "unknown optimizer " << c["optimizer"];
  if (c["optimizer"] == "Dion") {
    opt->init_state();
    for (size_t i = 0; i < n; ++i) {
      const std::string q0 = key("st", i, ".Q.s0");
      if (!st.has(q0)) continue;
      // Same generator, same draw order: the initial Q must match exactly — in the recording's
      // environment. Elsewhere randn's vectorized path draws other numbers (it differs by
      // instruction set), so the recorded Q is loaded and the steps still compare.
      if (exact)
        EXPECT_TRUE(at::equal(opt->state_of(params[i])->Q(), st.at(q0))) << q0;
      else
        opt->state_of(params[i])->Q().copy_(st.at(q0));
    }
  }

  double worst = 0;
  std::string worst_name;
  for (int t = 1; t <= steps; ++t) {
    const std::string s = ".s" + std::to_string(t);
    for (size_t i = 0; i < n; ++i) {
      const std::string g = key("g", i, s);
      params[i].mutable_grad() = st.has(g) ? st.at(g).clone() : at::Tensor();
    }
    opt->step();
    auto check = [&](const std::string& name, const at::Tensor& actual, const at::Tensor& expected,
                     bool columns_up_to_sign) {
      ASSERT_TRUE(actual.defined()) << name << " missing on our side";
      ASSERT_EQ(actual.sizes(), expected.sizes()) << name;
      ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << name;
      const Diff d = diff(columns_up_to_sign && !exact ? align_columns(actual, expected) : actual, expected);
      const bool variance_neuron = name.find(".variance_neuron.") != std::string::npos;
      const double tol_here = exact                                     ? 0.0
                              : expected.scalar_type() == at::kBFloat16 ? 1e-2
                              : bf16_ortho && variance_neuron           ? 1e-2
                              : bf16_ortho                              ? 5e-4
                              : columns_up_to_sign || bf16_state        ? 1e-4
                                                                        : 1e-6;
      if (std::getenv("DION_REF_VERBOSE") && d.max_abs > 0)
        std::printf("  %s: max |diff| %.3g, relative %.3g\n", name.c_str(), d.max_abs, d.rel());
      if (d.rel() > worst) {
        worst = d.rel();
        worst_name = name;
      }
      EXPECT_LE(d.rel(), tol_here) << GetParam() << " " << name << ": max |diff| " << d.max_abs << " vs max |expected| "
                                   << d.scale;
    };
    for (size_t i = 0; i < n; ++i) {
      check(key("p", i, s), params[i], st.at(key("p", i, s)), false);
      const dion::ParamState* state = opt->state_of(params[i]);
      for (const char* key_name : {"momentum", "variance", "variance_neuron", "Q", "step_dev"}) {
        const std::string name = key("st", i, std::string(".") + key_name + s);
        if (!st.has(name)) continue;
        ASSERT_NE(state, nullptr) << name;
        check(name, state_tensor(*state, key_name), st.at(name), std::string(key_name) == "Q");
      }
    }
  }
  std::printf("[ reference ] %-24s worst relative difference %.3g (%s)%s\n", GetParam().c_str(), worst,
              worst_name.c_str(), exact ? " [exact]" : (" [tolerances: " + why + "]").c_str());
}

INSTANTIATE_TEST_SUITE_P(AllCases, Reference, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

// The pins take effect where the kernels are chosen, not only in the environment variables: ATen
// reports the scalar capability, the global context has oneDNN off, MKL itself reports its
// COMPATIBLE branch (support/exact_env.h). In the plain tests (no DION_REF_EXACT) the opposite:
// the machine's own kernels, oneDNN on, MKL free to pick its branch.
TEST(ExactEnvironment, PinsTakeEffect) {
  if (kPinned) dion::testing::pin_exact_environment_switches();
  const json here = dion::testing::exact_environment_here();
  const int branch = dion::testing::mkl_branch();
  ASSERT_NE(branch, -1) << "this LibTorch's MKL exports no mkl_serv_cbwr_get: the exact environment cannot check MKL";
  if (kPinned) {
    EXPECT_EQ(here["cpu_capability"], "DEFAULT") << here.dump();
    EXPECT_EQ(here["mkldnn"], false) << here.dump();
    EXPECT_EQ(here["threads"], 1) << here.dump();
    EXPECT_EQ(branch, dion::testing::kMklBranchCompatible) << "MKL_CBWR=COMPATIBLE did not take";
  } else {
    EXPECT_EQ(here["mkldnn"], true) << "the plain tests must run the machine's own kernels: " << here.dump();
  }
  std::printf("[ exact env ] %s, MKL branch %d (auto %d)\n", here.dump().c_str(), branch,
              dion::testing::mkl_auto_branch());
}

// On an emulated CPU (tests/CMakeLists.txt: exact_cpu_*), the emulation took: MKL's automatic
// branch is the capped one (DION_EXPECT_MKL_AUTO_BRANCH_AT_MOST), or the non-Intel one when
// support/mkl_non_intel.cpp is linked in.
TEST(ExactEnvironment, EmulatedCpuTakesEffect) {
  const char* want = std::getenv("DION_EXPECT_MKL_AUTO_BRANCH_AT_MOST");
#ifdef DION_TEST_MKL_NON_INTEL
  ASSERT_NE(::dlsym(RTLD_DEFAULT, "dion_test_mkl_non_intel"), nullptr) << "support/mkl_non_intel.cpp is not linked in";
  EXPECT_EQ(dion::testing::mkl_auto_branch(), dion::testing::kMklAutoBranchNonIntel)
      << "MKL still takes this CPU for an Intel one: the interposed mkl_serv_intel_cpu_true is not in force";
#else
  if (want == nullptr) {  // no emulation: MKL names the branch it picks for this CPU
    EXPECT_GE(dion::testing::mkl_auto_branch(), 1) << "this LibTorch's MKL exports no mkl_serv_cbwr_get_auto_branch";
    return;
  }
#endif
  if (want != nullptr) {  // a cap: at most that branch (an AMD CPU's MKL picks the non-Intel one, 2)
    EXPECT_LE(dion::testing::mkl_auto_branch(), std::atoi(want)) << "the MKL instruction cap did not take";
  }
}

TEST(ReferenceData, AllSevenAlgorithmsCovered) {
  std::set<std::string> algos;
  for (const auto& name : case_names()) {
    const auto st = dion::testing::load_safetensors(reference_dir() + "/" + name + ".safetensors");
    const json c = json::parse(st.metadata.at("case"));
    algos.insert(c["optimizer"].get<std::string>());
    for (const auto& g : c["groups"])
      if (g["options"].contains("algorithm")) algos.insert(g["options"]["algorithm"].get<std::string>());
  }
  for (const char* a : {"Muon", "NorMuon", "Dion2", "NorDion2", "Dion3", "Dion", "adamw", "lion"})
    EXPECT_TRUE(algos.count(a)) << "no reference case for " << a;
}

}  // namespace
