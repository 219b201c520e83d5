#!/bin/sh
# tests/train/plot_cli_test.sh DION_TRAIN CASE — one bad-argument case of `dion-train plot`
# (tools/dion-train/plot.py through the dion-train wrapper): the exit status (2 for a bad command
# line, argparse's; 1 for bad data or an unusable output path), the message, no Python traceback
# and no PNG written. Registered per case as ctest dion_train_plot.CASE (cmake/DionTrain.cmake).
# Only error paths: nothing here needs matplotlib (tests/train/io/test_plot.py draws).
set -u
exe=$1
case_name=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dion_plot_cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/empty_run" "$tmp/run" "$tmp/out_folder"
printf '%s\n' '{"kind": "train", "step": 0, "loss": 5.0, "lr": 0.01, "tokens": 64, "tokens_per_s": 1.0, "ms_per_step": 1.0, "time_s": 1.0}' \
  >"$tmp/run/metrics.jsonl"

case $case_name in
  missing_run_dir)     want=1; text="$tmp/nowhere: no such folder"
                       set -- "$tmp/nowhere" -o "$tmp/c.png" ;;
  run_dir_without_metrics) want=1; text="$tmp/empty_run/metrics.jsonl: no such file"
                       set -- "$tmp/empty_run" -o "$tmp/c.png" ;;
  output_folder_missing) want=1; text="folder $tmp/nowhere does not exist"
                       set -- "$tmp/run" -o "$tmp/nowhere/c.png" ;;
  output_is_a_folder)  want=1; text="-o $tmp/out_folder: is a folder"
                       set -- "$tmp/run" -o "$tmp/out_folder" ;;
  no_run_dir)          want=2; text="RUN_DIR"
                       set -- -o "$tmp/c.png" ;;
  output_missing_value) want=2; text="-o/--output: expected one argument"
                       set -- "$tmp/run" -o ;;
  bad_smooth)          want=2; text="--smooth 1.5: must be 'auto' or a number in \[0, 1)"
                       set -- "$tmp/run" -o "$tmp/c.png" --smooth 1.5 ;;
  unknown_flag)        want=2; text="unrecognized arguments: --no-such-flag"
                       set -- "$tmp/run" -o "$tmp/c.png" --no-such-flag ;;
  *) echo "plot_cli_test.sh: unknown case '$case_name'"; exit 1 ;;
esac

out=$("$exe" plot "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq "$want" ] || { echo "FAIL: exit $rc, expected $want"; exit 1; }
printf '%s' "$out" | grep -q -e "$text" || { echo "FAIL: the output lacks: $text"; exit 1; }
if printf '%s' "$out" | grep -q 'Traceback'; then echo "FAIL: a Python traceback"; exit 1; fi
[ ! -e "$tmp/c.png" ] || { echo "FAIL: c.png was written"; exit 1; }
echo "ok: exit $rc"
