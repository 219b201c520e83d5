// tests/support/exact_env.h — the exact environment: every CPU-dependent choice of LibTorch's CPU
// kernels pinned, so that the reference vectors (tests/vectors/reference, recorded by
// microsoft/dion in the same environment) reproduce bit for bit on any x86-64 CPU.
//
// What depends on the CPU, and how each is pinned (tests/reference/README.md, "Exactness", has
// the measurements):
//   - ATen's vectorized kernels (element-wise, reductions, randn): one build per instruction set
//     (AVX512 / AVX2 / scalar), chosen at the first dispatch -> ATEN_CPU_CAPABILITY=default.
//   - oneDNN (mkldnn): bf16 GEMMs, whose kernels (AMX, AVX512-BF16, AVX512, AVX2 emulation)
//     accumulate in different orders -> off (the user switch of the global context); bf16 GEMMs
//     then run ATen's own gemm, under the pinned capability.
//   - MKL: fp32 GEMM, batched GEMM, LAPACK (QR, Cholesky), vector math; its code path is picked
//     per CPU -> MKL_CBWR=COMPATIBLE (its reproducible path, the same on Intel and AMD).
//   - Threads: reductions and BLAS partition work by thread count -> one thread.
// Each vector file's metadata records what it was recorded under (cpu_capability, mkl_cbwr,
// threads, mkldnn, torch, machine); exact_environment_differs() compares this process with it.
// The Python side (tests/python/exact_env.py) pins the same.
//
// DION_TEST_ENV="NAME=VALUE,NAME=VALUE" sets more variables before the kernels read theirs: ctest
// uses it to emulate other CPUs on this one (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS), under
// which the exact tests must still match bit for bit (tests/CMakeLists.txt, exact_cpu_*).
#pragma once

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <nlohmann/json.hpp>
#include <sys/utsname.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace dion::testing {

// Applies DION_TEST_ENV (see above). Call before the first ATen / MKL / oneDNN use (a static
// initializer), as pin_exact_environment_variables().
inline void apply_test_env() {
  const char* spec = std::getenv("DION_TEST_ENV");
  if (spec == nullptr) return;
  std::string s(spec);
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(start, end - start);
    if (const size_t eq = item.find('='); eq != std::string::npos && eq > 0)
      ::setenv(item.substr(0, eq).c_str(), item.substr(eq + 1).c_str(), 1);
    start = end + 1;
  }
}

// The variables of the exact environment; call before the first ATen / MKL use (both read them
// on their first call, after static initialization).
inline void pin_exact_environment_variables() {
  ::setenv("ATEN_CPU_CAPABILITY", "default", 1);
  ::setenv("MKL_CBWR", "COMPATIBLE", 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  ::setenv("MKL_NUM_THREADS", "1", 1);
}

// The switches of the exact environment that are set through ATen, not the environment.
inline void pin_exact_environment_switches() {
  at::set_num_threads(1);
  at::globalContext().setUserEnabledMkldnn(false);
}

// MKL's own word on its code path, through its service entry points (exported by
// libtorch_cpu.so; -1 when this MKL has none): mkl_branch() is the CNR branch in force (3:
// COMPATIBLE, 10: AVX2, 1: none), mkl_auto_branch() the one it would pick by itself on this CPU
// (14 on an AVX512 Intel Xeon, 10 under MKL_ENABLE_INSTRUCTIONS=AVX2, 2 when it takes the CPU
// for a non-Intel one: support/mkl_non_intel.cpp).
inline int mkl_service(const char* name, bool with_arg) {
  void* f = ::dlsym(RTLD_DEFAULT, name);
  if (f == nullptr) return -1;
  return with_arg ? reinterpret_cast<int (*)(int)>(f)(1) : reinterpret_cast<int (*)()>(f)();
}
inline int mkl_branch() { return mkl_service("mkl_serv_cbwr_get", true); }
inline int mkl_auto_branch() { return mkl_service("mkl_serv_cbwr_get_auto_branch", false); }
constexpr int kMklBranchCompatible = 3;
constexpr int kMklAutoBranchNonIntel = 2;

// What this process runs under, in the vector files' metadata keys.
inline nlohmann::json exact_environment_here() {
  utsname u{};
  ::uname(&u);
  const char* cbwr = std::getenv("MKL_CBWR");
  return {{"cpu_capability", at::get_cpu_capability()},
          {"mkl_cbwr", cbwr ? cbwr : ""},
          {"threads", at::get_num_threads()},
          {"mkldnn", at::globalContext().userEnabledMkldnn()},
          {"torch", TORCH_VERSION},
          {"machine", u.machine}};
}

// "" when this process runs what `recorded` (a case's metadata) was recorded under; else what
// differs ("mkldnn is true here, false when recorded"). torch compares its major.minor.patch.
inline std::string exact_environment_differs(const nlohmann::json& recorded) {
  const nlohmann::json here = exact_environment_here();
  for (const auto& [key, value] : here.items()) {
    if (!recorded.contains(key)) return key + " is " + value.dump() + " here, not recorded";
    nlohmann::json want = recorded.at(key);
    if (key == "torch" && want.is_string()) want = want.get<std::string>().substr(0, value.get<std::string>().size());
    if (want != value) return key + " is " + value.dump() + " here, " + recorded.at(key).dump() + " when recorded";
  }
  return "";
}

// "" when this CPU's float32 sqrt is correctly rounded under the pinned environment; else how
// many of 4096 inputs are not. torch.sqrt is MKL's vsSqrt, whose COMPATIBLE branch is not
// correctly rounded and rounds differently per microarchitecture: on an AMD EPYC (family 26)
// the reference itself, re-recorded there under the same pins, differs from the committed
// (Intel Xeon) vectors in exactly the classes whose step takes a square root (NorMuon, NorDion2,
// legacy Dion), by 1 ulp growing to 1.6e-5 on Dion's Q; dion-cpp equals that re-recording bit
// for bit. Where sqrt is inexact, those classes compare with the plain tests' tolerances and say
// why; every other class stays bit for bit.
inline std::string exact_unreachable_here() {
  const at::Tensor x = at::linspace(0.25, 4.0, 4096, at::kFloat);
  const at::Tensor want = at::sqrt(x.to(at::kDouble)).to(at::kFloat);  // correctly rounded (53 >= 2*24+2)
  const int64_t off = at::ne(at::sqrt(x), want).sum().item<int64_t>();
  if (off == 0) return "";
  return "LibTorch's float32 sqrt on this CPU is not correctly rounded (" + std::to_string(off) +
         " of 4096 inputs off by an ulp): its rounding depends on the microarchitecture, so vectors recorded on "
         "another CPU cannot replay bit for bit";
}

}  // namespace dion::testing
