import sys, numpy as np
d = sys.argv[1]  # split_stats.py SHARD_DIR INPUT_TXT
def docs(name):
    t = np.fromfile(f"{d}/{name}", dtype="<u2", offset=1024).astype(np.int64)
    starts = np.flatnonzero(t == 256)
    return t, np.diff(np.append(starts, t.size))
v, dv = docs("fineweb_val_000000.bin"); t, dt = docs("fineweb_train_000001.bin")
print(f"val:   {v.size:,} tokens, {dv.size} documents, mean {dv.mean():.1f} tokens, median {np.median(dv):.0f}")
print(f"train: {t.size:,} tokens, {dt.size} documents, mean {dt.mean():.1f} tokens, median {np.median(dt):.0f}")
print(f"documents {dv.size + dt.size:,}; val share of documents {dv.size / (dv.size + dt.size):.1%}, of tokens {v.size / (v.size + t.size):.1%}")
print(f"passes of the main job: 600 x 16 x 256 = {600*16*256:,} tokens / {t.size:,} = {600*16*256 / t.size:.3f}")
# Where the val paragraphs are: dion-data prepare's rule (src/data/prepare.cpp) replayed on the text.
text = open(sys.argv[2], "rb").read()
paras = [p for p in text.split(b"\n\n") if p]
total = to_val = 0
picked = []
for i, p in enumerate(paras):
    total += len(p) + 1  # its end-of-text and its bytes
    if to_val < 0.1 * total:
        to_val += len(p) + 1
        picked.append(i)
assert len(picked) == dv.size and to_val == v.size, (len(picked), to_val)
hist = np.histogram(np.array(picked) / len(paras), bins=10, range=(0, 1))[0]
print(f"val paragraphs per tenth of the text (replayed rule, {len(picked)} of {len(paras):,}): {' '.join(map(str, hist))}")
