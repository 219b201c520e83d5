#!/bin/sh
# tests/scripts/ngram_smoke.sh PYTHON SOURCE_DIR BUILD_DIR OUT — bench/ngram_baseline.py at order 3
# on byte shards of the first 60 kB of Tiny Shakespeare (dion-data prepare, as scripts/run.sh
# makes them): the val number is finite and below the train split's unigram entropy, --help
# works, and the model equals the plain rewrite in tests/scripts/ngram_reference.py to 1e-4 nats.
set -eu
PY=$1 SRC=$2 BUILD=$3 OUT=$4
fail() { echo "ngram_smoke: FAIL: $*" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
head -c 60000 "$SRC/data/tinyshakespeare/input.txt" |
  "$BUILD/dion-data" prepare - -o "$OUT/data" --tokenizer byte --delimiter '\n\n' --val-fraction 0.1 --quiet ||
  fail "dion-data prepare"
"$PY" "$SRC/bench/ngram_baseline.py" --help | grep -q -- "--order" || fail "--help does not list --order"
"$PY" "$SRC/bench/ngram_baseline.py" --data "$OUT/data" --order 3 --val-tokens 0 > "$OUT/stdout" 2> "$OUT/stderr" ||
  { cat "$OUT/stderr" >&2; fail "ngram_baseline.py exited $?"; }
cat "$OUT/stdout"
ref=$("$PY" "$SRC/tests/scripts/ngram_reference.py" "$OUT/data" 3) || fail "ngram_reference.py"
"$PY" - "$OUT/stdout" "$ref" <<'PYEOF' || fail "the numbers are not what they should be"
import math, re, sys
text, ref = open(sys.argv[1]).read(), float(sys.argv[2])
val = float(re.search(r"^ngram order 3 val ([0-9.]+) nats/token", text, re.M).group(1))
every = float(re.search(r"every val target \(1 \.\. [0-9,]+\), separators scored: ([0-9.]+)", text).group(1))
unigram = float(re.search(r"unigram entropy of the train split: ([0-9.]+)", text).group(1))
assert math.isfinite(val) and 0 < val < unigram - 0.5, (val, unigram)
assert abs(every - ref) < 1e-4, (every, ref)
PYEOF
echo "ngram_smoke: ok"
