#!/usr/bin/env bash
# dion-cpp on a second CPU kind: the test command (scripts/test.sh) with every kernel library
# capped to AVX2, so that an AVX-512 or AMX machine runs the kernels of an AVX2-only CPU (an AMD
# EPYC Zen 3) and a developer sees their failures before CI on such a machine does.
#
#   scripts/test_avx2.sh            # the whole suite, capped (arguments go to ctest: -R MoeRun)
#
# The caps: ATen's own kernels (ATEN_CPU_CAPABILITY), oneDNN (ONEDNN_MAX_CPU_ISA), MKL
# (MKL_ENABLE_INSTRUCTIONS); the project's own loss kernel (AVX-512, or AVX2 for fp32) follows ATen's
# capability (cross_entropy_inplace_available). Sanitizers are left out (DION_SKIP_SANITIZE=1):
# they check the data library, which uses none of these kernels. What the caps do not change:
# the CPU's flags (/proc/cpuinfo), so a test that picks a recording by CPU kind asks
# tests/cpu_kind.h, which reads the caps too, and the project's own kernels, which choose by those
# flags, keep their AVX-512 code: the ctest emulated_cpu_kinds runs theirs under an emulated CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
export DION_SKIP_SANITIZE=1
echo "[test_avx2] ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA" \
     "MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS on $(lscpu | sed -n 's/^Model name: *//p')"
exec scripts/test.sh "$@"
