"""tests/scripts/ngram_reference.py DATA ORDER — bench/ngram_baseline.py's model written again the
plain way (dictionaries of n-gram tuples, one query at a time): interpolated modified Kneser-Ney
over the 257 byte ids, plain KN's one discount where the three are out of range; prints the mean
nats over every val target (1 .. N-1, rows of 256). ngram_smoke.sh compares the two. Slow: small
data only."""
import collections
import math
import os
import sys

import numpy as np

V, T = 257, 256


def split(data, name):
    out = []
    for f in sorted(os.listdir(data)):
        if f.startswith(f"fineweb_{name}_") and f.endswith(".bin"):
            out += np.fromfile(os.path.join(data, f), dtype="<u2", offset=1024).tolist()
    return out


def discounts(counter):
    n = [sum(1 for v in counter.values() if v == i) for i in (1, 2, 3, 4)]
    y = n[0] / (n[0] + 2 * n[1])
    d = [0, 1 - 2 * y * n[1] / n[0], 2 - 3 * y * n[2] / n[1], 3 - 4 * y * n[3] / n[2]] if min(n) > 0 else None
    return d if d and all(0 < d[i] <= i for i in (1, 2, 3)) else [0, y, y, y]


def main():
    data, order = sys.argv[1], int(sys.argv[2])
    tr, va = split(data, "train"), split(data, "val")
    counts = {order: collections.Counter(tuple(tr[i:i + order]) for i in range(len(tr) - order + 1))}
    for k in range(order - 1, 0, -1):  # continuation counts: distinct ids before the k-gram
        counts[k] = collections.Counter(g[1:] for g in {tuple(tr[i:i + k + 1]) for i in range(len(tr) - k)})
    d = {k: discounts(c) for k, c in counts.items()}
    total, backoff = {}, {}
    for k, c in counts.items():
        total[k], backoff[k] = collections.defaultdict(float), collections.defaultdict(float)
        for g, n in c.items():
            total[k][g[:-1]] += n
            backoff[k][g[:-1]] += d[k][min(n, 3)]

    def prob(h, w):
        p = 1.0 / V
        for k in range(1, min(order, len(h) + 1) + 1):
            ctx = tuple(h[len(h) - k + 1:]) if k > 1 else ()
            if ctx in total[k]:
                n = counts[k].get(ctx + (w,), 0)
                p = (max(n - d[k][min(n, 3)], 0) + backoff[k][ctx] * p) / total[k][ctx]
        return p

    nll = 0.0
    for i in range(1, len(va)):
        avail = min(i, (i - 1) % T + 1, order - 1)
        nll -= math.log(prob(va[i - avail:i], va[i]))
    print(f"{nll / (len(va) - 1):.6f}")


if __name__ == "__main__":
    main()
