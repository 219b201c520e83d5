#!/usr/bin/env bash
# dion-cpp: the data library under the sanitizers. Builds the data tools alone (no
# LibTorch) with clang + AddressSanitizer + UndefinedBehaviorSanitizer in build-sanitize/, runs
# dion_data_tests there (any leak, overflow or undefined behaviour fails), then each libFuzzer
# target for DION_FUZZ_SECONDS (default 20) from the small committed corpus in tests/fuzz/corpus:
# the shard header, the tokenizer, and dion-train's config parser (src/train/config_*.cpp, built
# into fuzz_config without LibTorch).
# scripts/test.sh runs it after ctest (DION_SKIP_SANITIZE=1 skips it). About 2-3 minutes on 2 cores
# (the ASan build of about 100 s where ccache has none of it).
#
#   scripts/sanitize.sh                    # build + tests + fuzz
#   DION_FUZZ_SECONDS=300 scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${DION_SANITIZE_BUILD_DIR:-$ROOT/build-sanitize}
FUZZ_SECONDS=${DION_FUZZ_SECONDS:-20}
log() { printf '[sanitize] %s\n' "$*"; }

command -v clang++ >/dev/null || { log "clang++ not found: scripts/setup.sh installs clang"; exit 1; }
start=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
  # -O1 -gline-tables-only: reports with file:line, cheaper to build than -O3 -g. Warnings
  # are not errors here: this build is about run-time checks, and clang warns unlike gcc.
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DDION_DATA_ONLY=ON -DDION_BUILD_BENCH=OFF \
    -DDION_WERROR=OFF -DDION_SANITIZE=ON -DDION_FUZZ=ON >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)" --target dion-data dion_data_tests fuzz_shard_header fuzz_tokenizer fuzz_config
log "built in $(( $(date +%s) - start )) s"

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
t0=$(date +%s)
"$BUILD/dion_data_tests" --gtest_brief=1
log "dion_data_tests under ASan+UBSan: passed in $(( $(date +%s) - t0 )) s"

fuzz() {  # target, corpus name (tests/fuzz/NAME.dict, when there is one, is the dictionary)
  local work; work=$(mktemp -d)
  local dict=(); [ -f "$ROOT/tests/fuzz/$2.dict" ] && dict=(-dict="$ROOT/tests/fuzz/$2.dict")
  # New inputs go to the scratch folder; the committed corpus is only read.
  "$BUILD/$1" "${dict[@]}" -max_total_time="$FUZZ_SECONDS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD/$1-" "$work" "$ROOT/tests/fuzz/corpus/$2" \
    2>"$BUILD/$1.log" || { tail -40 "$BUILD/$1.log"; rm -rf "$work"; log "$1 FAILED (crash input in $BUILD)"; exit 1; }
  rm -rf "$work"
  log "$1: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$BUILD/$1.log" | grep -o '[0-9]*$') runs in ${FUZZ_SECONDS} s, no crash"
}
gpt2=${DION_GPT2_DIR:-$ROOT/data/gpt2}
for f in encoder.json vocab.bpe; do
  [ -f "$gpt2/$f" ] || { log "FAILED: fuzz_tokenizer needs $gpt2/$f (the repository's data/gpt2, listed in data/SHA256SUMS: git checkout -- data/)"; exit 1; }
done
# The three targets at once (each DION_FUZZ_SECONDS of wall clock, sharing the cores): the test
# command waits 20 s for them instead of 60.
pids=()
fuzz fuzz_shard_header shard_header & pids+=($!)
fuzz fuzz_config config & pids+=($!)
DION_GPT2_DIR=$gpt2 fuzz fuzz_tokenizer tokenizer & pids+=($!)
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { log "FAILED: a fuzz target above crashed or could not run"; exit 1; }
log "done in $(( $(date +%s) - start )) s"
