# scripts/tiny_shards.sh — sourced (not run) by the parallel-training scripts
# (parallel_equality.sh, soak_train_kill.sh, bench_parallel.sh): a scratch folder, removed when
# the script exits, holding the committed Tiny Shakespeare tokenized into 100,000-token shards.
#
#   source "$ROOT/scripts/tiny_shards.sh"
#   tiny_shards "$BUILD" NAME      # sets WORK=/tmp/NAME.XXXXXX; the shards are in $WORK/shards
tiny_shards() {
  local build=$1 name=$2 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  WORK=$(mktemp -d "/tmp/$name.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  "$build/dion-data" prepare "$root/data/tinyshakespeare/input.txt" -o "$WORK/shards" --shard-size 100000 \
    --tokenizer "$root/data/gpt2" > /dev/null 2>&1
}
