// tests/support/cpu_kind.h — which kind of CPU the kernels run as: the CPU's own flags, narrowed
// by the caps that make an AVX-512 or AMX CPU run an AVX2-only CPU's kernels (scripts/test_avx2.sh:
// ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS). Tests that pick a recording by
// CPU kind, or that expect a kernel by CPU, ask here rather than read /proc/cpuinfo themselves.
#pragma once

#include <ATen/Context.h>
#include <ATen/Version.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dion::testing {

// A flag of /proc/cpuinfo ("avx512f", "amx_tile"): what the CPU has, caps or not.
inline bool cpu_flag(const std::string& flag) {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

// True when an environment variable caps a kernel library at AVX2 or below.
inline bool capped_to_avx2() {
  auto upper = [](const char* name) {
    const char* v = std::getenv(name);
    std::string s = v ? v : "";
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
    return s;
  };
  const std::string aten = upper("ATEN_CPU_CAPABILITY"), mkl = upper("MKL_ENABLE_INSTRUCTIONS"),
                    onednn = upper("ONEDNN_MAX_CPU_ISA");
  return aten == "AVX2" || aten == "DEFAULT" || mkl == "AVX2" || mkl == "AVX" || mkl == "SSE4_2" || onednn == "AVX2" ||
         onednn == "AVX" || onednn == "SSE41";
}

// ATen's vectorized kernels are the AVX-512 ones (the CPU has it and no cap says otherwise).
inline bool aten_avx512() { return at::get_cpu_capability() == "AVX512"; }

// The CPU's vendor_id ("GenuineIntel", "AuthenticAMD").
inline std::string cpu_vendor() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("vendor_id", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "";
}

// The kernels' family, as tests/train/make_train_reference.py's kernel_isa(): "amx" (an Intel Xeon
// with AMX), "avx512" (AVX-512 without AMX: an AMD EPYC Zen 4 / 5), "avx2" (an AVX2-only CPU: an
// AMD EPYC Zen 3), and an AVX-512 CPU under the AVX2 caps by vendor, "avx2cap_intel" or
// "avx2cap_amd": MKL's AVX2 path differs between Intel and AMD CPUs (measured: an AMX Xeon capped
// against the Zen 3 recording, 2e-5 in train.py's losses by step 10).
inline std::string kernel_family() {
  if (!cpu_flag("avx512f")) return "avx2";
  if (capped_to_avx2()) return cpu_vendor() == "GenuineIntel" ? "avx2cap_intel" : "avx2cap_amd";
  return cpu_flag("amx_tile") ? "amx" : "avx512";
}

// bf16 GEMMs whose result does not depend on how many matrices share the call. ATen sends a bf16
// batched matmul to oneDNN only when batch * m * k * n exceeds 4096 (mkldnn/Matmul.cpp, checksize)
// and runs ATen's own gemm, matrix by matrix, below that. A test that compares one process
// (a megabatch of 4 matrices) with a rank's share (1 matrix) would then compare oneDNN's kernel
// with ATen's: equal on an AVX2-only CPU, a few elements a last bit apart on the AVX-512 and AMX
// ones (measured 2026-12-06 on an AMX Xeon: 2 of 307,200 elements of 16x16x16 products, batch 4
// against 1). With oneDNN off both sides run ATen's gemm per matrix and are equal by construction,
// so those tests keep tolerance 0. Call once, before any step (a namespace-scope initializer).
inline bool pin_batch_invariant_bf16_gemms() {
  at::globalContext().setUserEnabledMkldnn(false);
  return true;
}

}  // namespace dion::testing
