// src/train/model/cpu_isa.h — when this directory's own AVX-512 / AVX2 kernels may run (private
// to src/train/model: the loss kernel, cross_entropy_cpu.cpp, and the transpose-sum,
// transpose_cpu.cpp).
//
//   cpu_avx512_kernels(): the CPU has AVX-512 F, BW and VL and ATen runs its own AVX512 kernels;
//   cpu_avx2_kernels(): the CPU has AVX2 and FMA and ATen runs AVX2 or AVX512 kernels.
// ATen's capability counts so that ATEN_CPU_CAPABILITY=avx2 (scripts/test_avx2.sh) makes an
// AVX-512 CPU an AVX2-only one for these kernels as for ATen's, and `default` turns them off.
//
// DION_AVX512 / DION_AVX2 compile one function for that instruction set (a function attribute,
// so no inline function of a header is emitted with those instructions for the rest of the
// program); call such a function only where the matching check above is true.
#pragma once

#include <ATen/Version.h>

#define DION_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define DION_AVX2 __attribute__((target("avx2,fma")))

namespace dion::train {

inline bool cpu_avx512_kernels() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && at::get_cpu_capability() == "AVX512";
  return ok;
}

inline bool cpu_avx2_kernels() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         (at::get_cpu_capability() == "AVX2" || at::get_cpu_capability() == "AVX512");
  return ok;
}

}  // namespace dion::train
