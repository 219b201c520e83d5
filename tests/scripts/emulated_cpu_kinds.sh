#!/bin/sh
# tests/scripts/emulated_cpu_kinds.sh TEST_ELEMENTWISE DION_TRAIN_TESTS — the project's own CPU
# kernels on CPU kinds this machine is not, under QEMU's user-mode emulator (Debian's qemu-user,
# which scripts/setup.sh installs):
#
#   -cpu EPYC-Milan  an AMD EPYC Zen 3: AVX2 and FMA, no AVX-512 (x86-64 level v3)
#   -cpu Nehalem     no AVX at all (level v2)
#
# The kernels pick their code by the CPU's flags (GCC's target_clones and __builtin_cpu_supports:
# src/math/elementwise_update.cpp, src/train/model/{fused_cpu,router_cpu,cross_entropy_cpu}.cpp),
# so on an AVX-512 machine only their AVX-512 versions run, and scripts/test_avx2.sh's caps
# (ATen, oneDNN, MKL) do not change that. Under the emulator the CPU reports the emulated flags to
# every library: the AVX2 and the baseline versions run, with ATen, oneDNN and MKL on those CPUs'
# paths too. Checked first: that glibc sees the expected x86-64 level (0x7: v3; 0x3: v2), else
# the run would prove nothing. In-process suites only: a process a test starts (dion-train, the
# launcher) runs natively, and tests/cpu_kind.h reads /proc/cpuinfo, which is the host's.
#
# Suites: the fused element-wise optimizer kernels against ATen (test_elementwise, bit for bit),
# the model's fused kernels, the loss kernel and the MoE router (dion_train_tests TrainKernels*,
# TrainRouter, FusedCpu) but for two whole-model comparisons that take minutes under emulation
# (they run natively in ctest). About a minute in all on a 2-core machine; the EPYC-Milan run is
# left out on a host that is itself AVX2-only (it runs that code natively).
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 TEST_ELEMENTWISE DION_TRAIN_TESTS" >&2
  exit 2
fi
ELEMENTWISE=$1
TRAIN_TESTS=$2
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "emulated_cpu_kinds: qemu-x86_64 not found: install Debian's qemu-user (scripts/setup.sh does)" >&2
  exit 1
fi
LDSO=/lib64/ld-linux-x86-64.so.2
FILTER='TrainKernels*:TrainRouter.*:*FusedCpu*'
FILTER="$FILTER-TrainKernels.FastGptEqualsExactGptAndTheReferencesLoss"
FILTER="$FILTER:TrainKernels.FusedChunkedCrossEntropyEqualsLinearThenCrossEntropy"
# (the exp's 23 M values take 70 s emulated; its AVX2 form runs natively on every kind with AVX2)
FILTER="$FILTER:TrainKernels.VectorExpIsWithinOneUlp"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

# run CPU WHAT CMD...: CMD under the emulated CPU; its output (less QEMU's notes on CPUID bits
# it cannot emulate) shown on failure, its last lines always. Without scripts/test_avx2.sh's caps:
# the emulated CPU chooses its libraries' paths itself (ATen takes ATEN_CPU_CAPABILITY=avx2 as
# given, and on the Nehalem, which has no AVX, died of SIGILL under the caps).
run() {
  cpu=$1
  what=$2
  shift 2
  env -u ATEN_CPU_CAPABILITY -u ONEDNN_MAX_CPU_ISA -u MKL_ENABLE_INSTRUCTIONS \
    qemu-x86_64 -cpu "$cpu" "$@" >"$LOG" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    grep -v "TCG doesn't support requested feature" "$LOG"
    echo "emulated_cpu_kinds: FAILED on -cpu $cpu ($what): exit $rc" >&2
    exit 1
  fi
  echo "[emulated_cpu_kinds] -cpu $cpu, $what: $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' "$LOG" | tr '\n' ' ')"
}

# On a host without AVX-512 (an AMD Zen 3 itself) ctest already runs the AVX2 code natively, with
# the libraries on their AVX2 paths: the EPYC-Milan emulation would repeat it, minutes slower.
kinds="EPYC-Milan 0x7,Nehalem 0x3"
if ! grep -qw avx512f /proc/cpuinfo; then
  kinds="Nehalem 0x3"
  echo "[emulated_cpu_kinds] -cpu EPYC-Milan: not emulated, this CPU has AVX2 and no AVX-512 (its own run covers it)"
fi
IFS=,
for kind in $kinds; do
  unset IFS
  cpu=${kind% *}
  want=${kind#* }
  level=$(qemu-x86_64 -cpu "$cpu" "$LDSO" --list-diagnostics 2>/dev/null | sed -n 's/^x86\.cpu_features\.isa_1=//p')
  if [ "$level" != "$want" ]; then
    echo "emulated_cpu_kinds: -cpu $cpu: glibc sees x86-64 levels '$level', expected $want" >&2
    exit 1
  fi
  run "$cpu" "the fused optimizer kernels" "$ELEMENTWISE"
  run "$cpu" "the model's fused kernels, loss and router" "$TRAIN_TESTS" --gtest_filter="$FILTER"
done
echo "[emulated_cpu_kinds] passed on: $kinds (x86-64 level: 0x7 AVX2, 0x3 no AVX)"
