#!/usr/bin/env python3
"""A byte n-gram yardstick for the main job: interpolated modified Kneser-Ney (Chen & Goodman
1998: three discounts per order, D1, D2 and D3+, from that order's counts of counts), trained on
the train split and scored on the val split of the byte shards dion-train reads.

    python3 bench/ngram_baseline.py [--data data/shakespeare_bytes] [--order 5] [--val-tokens 32768]

The shards (docs/data.md): 256 int32 header words ([2] token count, [3] tokenizer, 1 = bytes),
then uint16 ids. The byte tokenizer's ids are the raw bytes 0..255 (no offset) and 256 is
end-of-text; `dion-data prepare --delimiter '\\n\\n'` drops the blank lines and puts one 256 before
every paragraph, so the separator stands where the blank line was. The model's vocabulary is
those 257 ids (the GPT's 63 padding rows of vocab_size 320 are ids no shard holds).

What is scored, by default exactly the targets of dion-train's val_loss (src/train/trainer.cpp
validate, src/train/loader.cpp): val_tokens / (16 x 256) batches from the start of the val split,
targets at positions 1 .. val_tokens, each row of 256 its own context (a target at column c of a
row has c + 1 tokens of history, as the GPT's). The separators (id 256) are targets like any other
token and are scored, as in the GPT's loss. Also printed: every target of the val split, and the
same without the separator targets. Nats a token = nats a byte, except that a separator stands
for the two newline bytes it replaced.

The model: counts of every k-gram (k = 1 .. order) over the train split as one stream. The top
order uses raw counts, lower orders continuation counts (how many distinct tokens precede the
k-gram); each order interpolates with the next lower one with the discounted mass as weight, and
the lowest with the uniform distribution over the 257 ids. A context never seen in train backs off
to the lower order. No smoothing parameter is fitted on val. Before scoring it checks that the
distribution sums to 1 over the 257 ids in a sample of val contexts.
"""
import argparse
import glob
import math
import os
import resource
import sys
import time

import numpy as np

V = 257  # byte ids 0..255 and end-of-text 256 (src/data/byte_tokenizer.cpp)
EOT = 256
MAGIC = 20240520


class NgramError(Exception):
    pass


def read_shard(path):
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 1024:
        raise NgramError(f"{path}: {raw.size} bytes, shorter than the 1024-byte header")
    head = raw[:1024].view("<i4")
    if head[0] != MAGIC or head[1] != 1:
        raise NgramError(f"{path}: magic {head[0]} version {head[1]}, not a shard (docs/data.md)")
    if head[3] != 1:
        raise NgramError(f"{path}: tokenizer slot {head[3]}, not byte shards (1); make them with "
                         f"`dion-data prepare ... --tokenizer byte`")
    tokens = raw[1024:].view("<u2")
    if tokens.size != head[2]:
        raise NgramError(f"{path}: header says {head[2]} tokens, the file holds {tokens.size}")
    if tokens.size and int(tokens.max()) >= V:
        raise NgramError(f"{path}: id {int(tokens.max())} is outside the byte vocabulary (< {V})")
    return tokens.astype(np.int64)


def read_split(data, prefix, split):
    paths = sorted(glob.glob(os.path.join(data, f"{prefix}_{split}_*.bin")))
    if not paths:
        raise NgramError(f"no {prefix}_{split}_*.bin in {data}: make the shards with `dion-data prepare "
                         f"data/tinyshakespeare/input.txt -o {data} --tokenizer byte --delimiter '\\n\\n' "
                         f"--val-fraction 0.1` (what scripts/run.sh runs)")
    return np.concatenate([read_shard(p) for p in paths]), len(paths)


def kgram_keys(stream, k):
    """The base-V key of every k-gram of the stream (ending at positions k-1 .. N-1)."""
    n = stream.size - k + 1
    key = np.zeros(n, dtype=np.int64)
    for j in range(k):
        key = key * V + stream[j:j + n]
    return key


def discounts(counts):
    """Modified KN discounts [0, D1, D2, D3+] (indexed by min(count, 3)) from the counts of counts
    n1..n4, and True; where those are out of (0, c] (little data), plain KN's one discount
    n1 / (n1 + 2 n2) for every count, and False."""
    n = [int(np.count_nonzero(counts == i)) for i in (1, 2, 3, 4)]
    y = n[0] / (n[0] + 2 * n[1]) if n[0] + n[1] else 0.5
    if min(n) > 0:
        d = [1 - 2 * y * n[1] / n[0], 2 - 3 * y * n[2] / n[1], 3 - 4 * y * n[3] / n[2]]
        if all(0 < x <= i + 1 for i, x in enumerate(d)):
            return np.array([0.0] + d), True
    return np.array([0.0, y, y, y]), False


class Level:
    """One order k: the k-grams (sorted keys, their counts) and their contexts' totals."""

    def __init__(self, keys, counts, k):
        self.k = k
        self.keys, self.counts = keys, counts
        self.d, self.modified = discounts(counts)
        ctx = keys // V
        self.ctx, first = np.unique(ctx, return_index=True)
        bounds = np.append(first, keys.size)
        self.total = np.add.reduceat(counts, first).astype(np.float64)
        capped = np.minimum(counts, 3)
        mass = np.add.reduceat(self.d[capped], first)  # sum over w of D(c(hw)): the back-off weight
        self.backoff = mass.astype(np.float64)
        assert bounds[-1] == keys.size


def train(stream, order):
    """Levels 1 .. order (index k-1)."""
    levels = [None] * order
    top_keys, top_counts = np.unique(kgram_keys(stream, order), return_counts=True)
    levels[order - 1] = Level(top_keys, top_counts, order)
    higher = top_keys
    for k in range(order - 1, 0, -1):
        # continuation count of a k-gram: how many distinct (k+1)-gram types end in it
        suffix = higher % (V ** k)
        keys, counts = np.unique(suffix, return_counts=True)
        levels[k - 1] = Level(keys, counts, k)
        higher = np.unique(kgram_keys(stream, k))  # the k-gram types, for the next order down
        # (every k-gram type that ends a (k+1)-gram is also a k-gram type; the stream's first
        # k-gram has no predecessor and keeps a continuation count of 0, as in KN)
    return levels


def lookup(sorted_keys, q):
    """(found mask, index) of q in sorted_keys."""
    i = np.searchsorted(sorted_keys, q)
    i_c = np.minimum(i, sorted_keys.size - 1)
    return (sorted_keys[i_c] == q) if sorted_keys.size else np.zeros(q.shape, bool), i_c


def prob(levels, hist, target, avail):
    """P(target | history) for each query: hist [n, order-1] the preceding ids (last column the
    nearest), avail [n] how many of them the model may use."""
    order = len(levels)
    p = np.full(target.shape, 1.0 / V)
    for k in range(1, order + 1):
        lev = levels[k - 1]
        use = avail >= k - 1
        ctx = np.zeros(target.shape, dtype=np.int64)
        for j in range(k - 1):  # the k-1 nearest ids, oldest first
            ctx = ctx * V + hist[:, order - 1 - (k - 1) + j]
        key = ctx * V + target
        has_ctx, ci = lookup(lev.ctx, ctx)
        has_key, ki = lookup(lev.keys, key)
        c = np.where(has_key, lev.counts[ki], 0).astype(np.float64)
        disc = lev.d[np.minimum(c, 3).astype(np.int64)]
        tot = lev.total[ci]
        new = (np.maximum(c - disc, 0.0) + lev.backoff[ci] * p) / np.where(has_ctx, tot, 1.0)
        p = np.where(use & has_ctx, new, p)
    return p


def histories(stream, positions, order, seq_len):
    """For targets stream[positions]: the order-1 preceding ids and how many the GPT's row allows."""
    w = order - 1
    hist = np.zeros((positions.size, max(w, 1)), dtype=np.int64)
    for j in range(w):  # column j holds the id at position - (w - j)
        src = positions - (w - j)
        hist[:, j] = np.where(src >= 0, stream[np.maximum(src, 0)], 0)
    avail = positions.copy()  # ids before the target in the stream
    if seq_len > 0:  # the GPT's rows: a target at column c of its row sees c + 1 ids
        avail = np.minimum(avail, (positions - 1) % seq_len + 1)
    return hist, avail


def check_normalized(levels, stream, order, rng):
    """The model's distribution sums to 1 over the 257 ids, for 32 val contexts."""
    pos = rng.integers(order, stream.size, size=32)
    hist, avail = histories(stream, pos, order, 0)
    h = np.repeat(hist, V, axis=0)
    a = np.repeat(avail, V)
    t = np.tile(np.arange(V, dtype=np.int64), pos.size)
    s = prob(levels, h, t, a).reshape(pos.size, V).sum(axis=1)
    if not np.allclose(s, 1.0, atol=1e-9):
        raise NgramError(f"the distribution does not sum to 1 (sums {s.min():.12f} .. {s.max():.12f})")
    return float(np.abs(s - 1).max())


def nats(levels, stream, positions, order, seq_len, chunk=1 << 16):
    out = np.empty(positions.size)
    for i in range(0, positions.size, chunk):
        pos = positions[i:i + chunk]
        hist, avail = histories(stream, pos, order, seq_len)
        out[i:i + chunk] = -np.log(prob(levels, hist, stream[pos], avail))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--data", default="data/shakespeare_bytes",
                    help="folder of byte shards (default data/shakespeare_bytes, what scripts/run.sh writes)")
    ap.add_argument("--prefix", default="fineweb", help="shard name prefix (default fineweb)")
    ap.add_argument("--order", type=int, default=5, help="n-gram order: the context is order-1 ids (default 5)")
    ap.add_argument("--val-tokens", type=int, default=32768,
                    help="targets 1 .. N of the val split, as dion-train's val_tokens (default 32768, the "
                         "main job's); 0: every target of the val split")
    ap.add_argument("--sequence-length", type=int, default=256,
                    help="the GPT's row length: a target sees at most its column + 1 ids (default 256, the "
                         "main job's); 0: the whole preceding val stream")
    args = ap.parse_args()
    if not 1 <= args.order <= 7:
        raise NgramError(f"--order {args.order}: use 1 .. 7 (keys are base-{V} int64)")
    if args.val_tokens < 0 or args.sequence_length < 0:
        raise NgramError("--val-tokens and --sequence-length must be >= 0")
    t0 = time.process_time()
    tr, ntr = read_split(args.data, args.prefix, "train")
    va, nva = read_split(args.data, args.prefix, "val")
    if args.val_tokens >= va.size:
        raise NgramError(f"--val-tokens {args.val_tokens}: the val split holds {va.size} tokens (targets "
                         f"1 .. {va.size - 1}); use at most {va.size - 1}, or 0 for all")
    print(f"ngram: order {args.order}, interpolated modified Kneser-Ney over {V} ids (bytes 0-255, "
          f"end-of-text 256); train {tr.size:,} tokens ({ntr} shard(s)), val {va.size:,} tokens "
          f"({int(np.count_nonzero(va == EOT))} separators) in {args.data}", file=sys.stderr, flush=True)
    levels = train(tr, args.order)
    plain = [lev.k for lev in levels if not lev.modified]
    print(f"ngram: trained in {time.process_time() - t0:.1f} s CPU: "
          + ", ".join(f"{lev.k}-grams {lev.keys.size:,}" for lev in levels)
          + (f"; order(s) {plain}: plain KN's one discount (too few counts for three)" if plain else ""),
          file=sys.stderr, flush=True)
    dev = check_normalized(levels, va, args.order, np.random.default_rng(0))
    # Unigram yardstick: the train split's id frequencies (maximum likelihood), their entropy.
    freq = np.bincount(tr, minlength=V) / tr.size
    unigram = float(-(freq[freq > 0] * np.log(freq[freq > 0])).sum())
    n = args.val_tokens or va.size - 1
    pos = np.arange(1, n + 1)
    gpt = nats(levels, va, pos, args.order, args.sequence_length)
    sep = va[pos] == EOT
    allpos = np.arange(1, va.size)
    every = nats(levels, va, allpos, args.order, args.sequence_length)
    every_sep = va[allpos] == EOT
    rows = [
        (f"val_loss targets (1 .. {n:,}, rows of {args.sequence_length or 'unlimited'}), separators scored",
         gpt.mean(), n, int(sep.sum())),
        (f"every val target (1 .. {va.size - 1:,}), separators scored", every.mean(), every.size,
         int(every_sep.sum())),
        ("every val target, separators not scored", every[~every_sep].mean(), int((~every_sep).sum()), 0),
    ]
    for name, v, count, s in rows:
        if not math.isfinite(v):
            raise NgramError(f"{name}: {v} nats (not finite)")
        print(f"  {name}: {v:.4f} nats/token over {count:,} targets ({s} separators)")
    cpu = time.process_time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"unigram entropy of the train split: {unigram:.4f} nats/token; distribution sums to 1 within {dev:.1e}")
    print(f"ngram order {args.order} val {rows[0][1]:.4f} nats/token (dion-train val_loss tokens, separators "
          f"scored); {cpu:.1f} s CPU, {rss:.0f} MiB peak")


if __name__ == "__main__":
    try:
        main()
    except NgramError as e:
        print(f"ngram_baseline.py: error: {e}", file=sys.stderr)
        sys.exit(1)
