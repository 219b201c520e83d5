// Reference vectors: dion-cpp against microsoft/dion, step by step.
//
// Each tests/data/reference/<case>.safetensors was recorded by tests/reference/make_vectors.py
// running the reference optimizer on CPU (one process, torch.compile off). This test rebuilds
// the same optimizer from the case's metadata, feeds the same gradients, and after every step
// compares every parameter and every state tensor.
//
// Exactness. The reference's result is reproducible bit for bit only by the same kernels:
// ATen's vectorized CPU kernels differ per instruction set (AVX512 / AVX2 / scalar), MKL picks
// its code path per CPU, and multithreaded reductions and BLAS calls partition work by thread
// count. The vectors record the environment they were made in (metadata: cpu_capability,
// mkl_cbwr, threads, torch, machine; tests/reference/README.md: ATEN_CPU_CAPABILITY=default,
// MKL_CBWR=COMPATIBLE, one thread). When this process runs in that environment every parameter
// and state tensor must match EXACTLY (max |diff| == 0, legacy Dion's Q included, no sign
// alignment). ctest runs the suite so as the "exact." tests: DION_REF_EXACT=1 makes the binary
// pin the kernels itself, and an environment that still differs a failure, not a fallback.
//
// In any other environment (the plain, unprefixed tests: the machine's own kernels and
// LibTorch's default thread count) the comparison uses tolerances, relative to the largest
// magnitude of the expected tensor. Observed on an AVX512 machine with MKL's automatic path, at
// 1 and at 2 threads, over all 30 cases:
//   - fp32 parameters and state (fp32 cases, Q aside): 1.8e-7, about two fp32 ulps (2^-23 =
//     1.2e-7) after 5 steps: tolerance 1e-6.
//   - legacy Dion's Q (fp32): 3.9e-5. Q = R / ||R_col|| comes out of an fp32 QR / Cholesky QR,
//     whose rounding is amplified by P's conditioning: tolerance 1e-4. Compared up to the sign
//     of each column: a QR factor is unique only up to column signs (P Q^T does not depend on
//     them), and another LAPACK path may pick other signs.
//   - fp32 tensors of cases with bf16 parameters or bf16 (mixed-precision) state: 2.6e-5; a bf16
//     rounding that flips by one ulp moves them by lr times that ulp: tolerance 1e-4.
//   - bf16 tensors: 8.1e-3, one bf16 ulp (2^-7 = 7.8e-3) of an element near the largest:
//     tolerance 1e-2.
//   - legacy Dion's initial Q: randn draws other numbers with another instruction set, so the
//     recorded Q is loaded instead of compared.
// Multithreading alone (pinned kernels, 2 threads) moves only the two low-rank Dion cases
// (randomized Cholesky QR: MKL's threaded QR / GEMM), by 6.7e-7 on Q.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <sys/utsname.h>
#include <torch/version.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "dion/dion.h"
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

std::string reference_dir() { return std::string(DION_SOURCE_DIR) + "/tests/data/reference"; }

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
    if (k == "lr") o.lr(v.get<double>());
    else if (k == "mu") o.mu(v.get<double>());
    else if (k == "weight_decay") o.weight_decay(v.get<double>());
    else if (k == "nesterov") o.nesterov(v.get<bool>());
    else if (k == "cautious_wd") o.cautious_wd(v.get<bool>());
    else if (k == "flatten") o.flatten(v.get<bool>());
    else if (k == "muon_beta2") o.muon_beta2(v.get<double>());
    else if (k == "fraction") o.fraction(v.get<double>());
    else if (k == "ef_decay") o.ef_decay(v.get<double>());
    else if (k == "rank_fraction") o.rank_fraction(v.get<double>());
    else if (k == "rank_multiple_of") o.rank_multiple_of(v.get<int64_t>());
    else if (k == "adjust_lr") o.adjust_lr(v.is_null() ? std::string("none") : v.get<std::string>());
    else if (k == "use_polar_express")
      ortho.method = v.get<bool>() ? dion::math::OrthoMethod::POLAR_EXPRESS : dion::math::OrthoMethod::NEWTON_SCHULZ;
    else if (k == "mixed_precision") o.momentum_dtype(at::kBFloat16).Q_dtype(at::kBFloat16);
    else FAIL() << "unknown constructor argument in case: " << k;
  }
}

dion::Override group_override(const json& opts) {
  dion::Override ov;
  for (const auto& [k, v] : opts.items()) {
    if (k == "algorithm") ov.algorithm = v.get<std::string>();
    else if (k == "lr") ov.lr = v.get<double>();
    else if (k == "cautious_wd") ov.cautious_wd = v.get<bool>();
    else if (k == "num_heads") ov.num_heads = v.get<int64_t>();
    else if (k == "split_sizes") ov.split_sizes = v.get<std::vector<int64_t>>();
    else if (k == "weight_decay") ov.weight_decay = v.get<double>();
    else ADD_FAILURE() << "unknown group option in case: " << k;
  }
  return ov;
}

std::unique_ptr<dion::Optimizer> make_optimizer(const std::string& cls, const json& c,
                                                const std::vector<at::Tensor>& params) {
  dion::math::OrthoConfig ortho;
  dion::Options defaults;
  if (cls == "Muon") defaults = dion::Muon::defaults();
  else if (cls == "NorMuon") defaults = dion::NorMuon::defaults();
  else if (cls == "Dion2") defaults = dion::Dion2::defaults();
  else if (cls == "NorDion2" || cls == "Dion3") defaults = dion::Dion3::defaults();
  else if (cls == "Dion") defaults = dion::Dion::defaults();
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

// DION_REF_EXACT=1: pin the kernels before ATen and MKL choose theirs (both read these variables
// at their first call, after static initialization).
const bool kPinned = [] {
  if (!std::getenv("DION_REF_EXACT")) return false;
  ::setenv("ATEN_CPU_CAPABILITY", "default", 1);
  ::setenv("MKL_CBWR", "COMPATIBLE", 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  return true;
}();

// Whether this process runs the kernels the case was recorded with (see the top of the file);
// `why` says what differs.
bool exact_environment(const json& c, std::string& why) {
  utsname u{};
  ::uname(&u);
  const char* cbwr = std::getenv("MKL_CBWR");
  const std::vector<std::tuple<std::string, std::string, std::string>> checks = {
      {"cpu_capability", at::get_cpu_capability(), c.value("cpu_capability", std::string("?"))},
      {"MKL_CBWR", cbwr ? cbwr : "", c.value("mkl_cbwr", std::string("?"))},
      {"threads", std::to_string(at::get_num_threads()), std::to_string(c.value("threads", 0))},
      {"torch", TORCH_VERSION, c.value("torch", std::string("?")).substr(0, std::string(TORCH_VERSION).size())},
      {"machine", u.machine, c.value("machine", std::string("?"))}};
  for (const auto& [what, here, recorded] : checks)
    if (here != recorded) {
      why = what + " is '" + here + "' here, '" + recorded + "' when recorded";
      return false;
    }
  return true;
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, MatchesStepByStep) {
  const auto st = dion::testing::load_safetensors(reference_dir() + "/" + GetParam() + ".safetensors");
  const json c = json::parse(st.metadata.at("case"));
  if (kPinned) at::set_num_threads(1);
  // bf16 parameters or mixed-precision state feed fp32 tensors through bf16 roundings.
  const bool bf16_state = c["dtype"] == "bfloat16" || c["ctor"].contains("mixed_precision");
  std::string why;
  const bool exact = exact_environment(c, why);
  if (!exact && std::getenv("DION_REF_EXACT"))
    FAIL() << "DION_REF_EXACT is set but this environment cannot reproduce the vectors bit for bit: " << why;
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
      if (exact) EXPECT_TRUE(at::equal(opt->state_of(params[i])->Q(), st.at(q0))) << q0;
      else opt->state_of(params[i])->Q().copy_(st.at(q0));
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
      const double tol_here = exact                                        ? 0.0
                              : expected.scalar_type() == at::kBFloat16 ? 1e-2
                              : columns_up_to_sign || bf16_state        ? 1e-4
                                                                        : 1e-6;
      if (std::getenv("DION_REF_VERBOSE") && d.max_abs > 0)
        std::printf("  %s: max |diff| %.3g, relative %.3g\n", name.c_str(), d.max_abs, d.rel());
      if (d.rel() > worst) {
        worst = d.rel();
        worst_name = name;
      }
      EXPECT_LE(d.rel(), tol_here) << GetParam() << " " << name << ": max |diff| " << d.max_abs
                                   << " vs max |expected| " << d.scale;
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
