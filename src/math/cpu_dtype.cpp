// The CPU compute dtype of the fast orthogonalizer and Gram Newton-Schulz (see
// include/dion/math/ortho.h, "CPU compute dtype").
//
// What it is: a rule on the CPU's instruction sets (cpuinfo, through at::cpu) and the ISA cap
// oneDNN obeys (ONEDNN_MAX_CPU_ISA), not a measurement: the same machine and environment give
// the same dtype every run. ATen sends fp16 and bf16 CPU GEMMs to oneDNN only when oneDNN has
// kernels for that type at its (capped) ISA, and oneDNN's kernels are fast only on the
// instructions that multiply the type (bf16 on plain AVX-512 is emulated); otherwise they take
// ATen's scalar fallback, 30-90x slower than fp32 (docs/benchmarks.md). The rule asks whether
// those instructions are there and allowed. Conservative where it does not know: AVX2_VNNI_2's
// fp16 / bf16 conversions and ARM's fp16 count as not native (fp32 is then picked).
#include "dion/math/ortho.h"

#include <ATen/Context.h>
#include <ATen/cpu/Utils.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace dion::math {

namespace {

// oneDNN's ISA bit masks (dnnl_cpu_isa_t, oneDNN 3.x): an ISA includes another when its mask
// has all of the other's bits. The names are what ONEDNN_MAX_CPU_ISA accepts.
struct Isa {
  const char* name;
  uint32_t mask;
};
constexpr uint32_t kAvx2Vnni2 = 0x1f, kAvx512Core = 0x27, kAvx512CoreBf16 = 0xe7, kAvx512CoreFp16 = 0x1ef,
                   kAvx512CoreAmx = 0xfef, kAvx512CoreAmxFp16 = 0x1fef;
constexpr Isa kIsas[] = {
    {"SSE41", 0x1},
    {"AVX", 0x3},
    {"AVX2", 0x7},
    {"AVX2_VNNI", 0xf},
    {"AVX2_VNNI_2", kAvx2Vnni2},
    {"AVX512_CORE", kAvx512Core},
    {"AVX512_CORE_VNNI", 0x67},
    {"AVX512_CORE_BF16", kAvx512CoreBf16},
    {"AVX512_CORE_FP16", kAvx512CoreFp16},
    {"AVX10_1_512", kAvx512CoreFp16},
    {"AVX512_CORE_AMX", kAvx512CoreAmx},
    {"AVX10_1_512_AMX", kAvx512CoreAmx},
    {"AVX512_CORE_AMX_FP16", kAvx512CoreAmxFp16},
    {"AVX10_1_512_AMX_FP16", kAvx512CoreAmxFp16},
    {"AVX10_2_512", 0x201ff},
    {"AVX10_2_512_AMX_2", 0x22fff},
};

// The cap oneDNN applies: ONEDNN_MAX_CPU_ISA, else its older name DNNL_MAX_CPU_ISA. Unset,
// empty, DEFAULT, ALL or a name oneDNN does not know: no cap (oneDNN ignores those too).
struct IsaCap {
  std::string text;  // "ONEDNN_MAX_CPU_ISA=AVX2", empty when there is no cap
  uint32_t mask = ~0u;
};

IsaCap isa_cap() {
  for (const char* var : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    std::string name(v);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
    for (const Isa& isa : kIsas)
      if (name == isa.name) return {std::string(var) + "=" + v, isa.mask};
    return {};
  }
  return {};
}

bool allows(const IsaCap& cap, uint32_t isa) { return (cap.mask & isa) == isa; }

// cpuinfo's flags, read once (they do not change while the process runs).
struct CpuFlags {
  bool avx512_fp16 = false, amx_fp16 = false, avx512_bf16 = false, amx_bf16 = false;
  bool avx512_core = false, avx_ne_convert = false;  // oneDNN's AVX512_CORE: F, BW, VL and DQ
};

const CpuFlags& cpu_flags() {
  static const CpuFlags flags = [] {
    CpuFlags f;
    const auto caps = at::cpu::get_cpu_capabilities();
    auto has = [&caps](const char* key) {
      auto it = caps.find(key);
      return it != caps.end() && it->second.isBool() && it->second.toBool();
    };
    f.avx512_fp16 = has("avx512_fp16");
    f.amx_fp16 = has("amx_fp16");
    f.avx512_bf16 = has("avx512_bf16");
    f.amx_bf16 = has("amx_bf16");
    f.avx512_core = has("avx512_f") && has("avx512_bw") && has("avx512_vl") && has("avx512_dq");
    f.avx_ne_convert = has("avx_ne_convert");
    return f;
  }();
  return flags;
}

}  // namespace

std::string dtype_short_name(at::ScalarType dt) {
  switch (dt) {
    case at::kHalf:
      return "fp16";
    case at::kBFloat16:
      return "bf16";
    case at::kFloat:
      return "fp32";
    case at::kDouble:
      return "fp64";
    default:
      return c10::toString(dt);
  }
}

bool cpu_has_native_gemm(at::ScalarType dtype, std::string* why) {
  auto say = [why](std::string text) {
    if (why) *why = std::move(text);
  };
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    say(dtype_short_name(dtype) + " GEMMs are native on every CPU");
    return true;
  }
  const bool half = dtype == at::kHalf;
  const std::string type = dtype_short_name(dtype);
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) {
    say(type + " GEMMs are not native: oneDNN is " +
        std::string(at::hasMKLDNN() ? "disabled (torch.backends.mkldnn.enabled = False)" : "not in this LibTorch"));
    return false;
  }
  const CpuFlags& f = cpu_flags();
  // The instruction sets that multiply this type natively, and the oneDNN ISA each needs.
  const char* vec = half ? "avx512_fp16" : "avx512_bf16";
  const char* amx = half ? "amx_fp16" : "amx_bf16";
  const bool has_vec = half ? f.avx512_fp16 : f.avx512_bf16, has_amx = half ? f.amx_fp16 : f.amx_bf16;
  const uint32_t vec_isa = half ? kAvx512CoreFp16 : kAvx512CoreBf16;
  const uint32_t amx_isa = half ? kAvx512CoreAmxFp16 : kAvx512CoreAmx;
  const char* vec_isa_name = half ? "AVX512_CORE_FP16" : "AVX512_CORE_BF16";
  if (!has_vec && !has_amx) {
    say(type + " GEMMs are not native: this CPU has neither " + vec + " nor " + amx);
    return false;
  }
  const IsaCap cap = isa_cap();
  const std::string have = has_amx ? std::string(amx) + (has_vec ? std::string(" and ") + vec : "") : vec;
  if ((has_vec && allows(cap, vec_isa)) || (has_amx && allows(cap, amx_isa))) {
    say(type + " GEMMs are native: this CPU has " + have + (cap.text.empty() ? "" : " (" + cap.text + " allows it)"));
    return true;
  }
  say(type + " GEMMs are not native: this CPU has " + have + ", but " + cap.text + " caps oneDNN below " +
      vec_isa_name);
  return false;
}

bool aten_bf16_matmul_uses_onednn() {
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) return false;
  // oneDNN reads its cap once, when first used; so does this (a later setenv changes neither).
  static const bool isa = [] {
    const CpuFlags& f = cpu_flags();
    const IsaCap cap = isa_cap();
    return (f.avx512_core && allows(cap, kAvx512Core)) || (f.avx_ne_convert && allows(cap, kAvx2Vnni2));
  }();
  return isa;
}

at::ScalarType cpu_dtype_from_string(const std::string& name) {
  if (name == "fp16") return at::kHalf;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp32") return at::kFloat;
  throw std::invalid_argument("unknown CPU compute dtype '" + name + "': valid values are 'fp16', 'bf16' and 'fp32'");
}

CpuComputeDtype cpu_compute_dtype(at::ScalarType wanted) {
  if (const char* v = std::getenv("DION_FAST_CPU_DTYPE"); v != nullptr && *v != '\0' && std::string(v) != "auto") {
    at::ScalarType dt;
    try {
      dt = cpu_dtype_from_string(v);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("DION_FAST_CPU_DTYPE: ") + e.what() + " (or 'auto')");
    }
    return {dt, dtype_short_name(dt) + ": DION_FAST_CPU_DTYPE=" + v};
  }
  std::string why;
  if (cpu_has_native_gemm(wanted, &why)) return {wanted, dtype_short_name(wanted) + ": " + why};
  std::string reason = "fp32: " + why + ", and fp32 GEMMs are faster than their fallback";
  if (wanted == at::kHalf) reason += " (not bf16: too coarse for the iterated Gram polynomial)";
  return {at::kFloat, reason};
}

}  // namespace dion::math
