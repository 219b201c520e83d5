#!/usr/bin/env python3
"""compare.py — GPT-2 tokenization throughput: dion's C++ tokenizer vs tiktoken, same text.

Runs bench_tokenizer (Google Benchmark, single thread) and tiktoken's gpt2 encode_ordinary
(built offline from the same GPT-2 files, single thread) on one text, checks that both give the
same ids, and prints MB/s (decimal megabytes of input text per second) and the ratio.

  python3 bench/tokenizer/compare.py --bench build/bench_tokenizer \
      [--text data/tinyshakespeare/input.txt] [--tokenizer data/gpt2] [--repeat 10]

Needs `pip install tiktoken` (a dev-time tool, like scripts/make_tokenizer_vectors.py).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import tiktoken
import tiktoken.load

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="path to the built bench_tokenizer")
    p.add_argument("--text", default=os.path.join(REPO, "data", "tinyshakespeare", "input.txt"))
    p.add_argument("--tokenizer", dest="gpt2_dir", default=os.path.join(REPO, "data", "gpt2"),
                   help="folder with the GPT-2 files encoder.json and vocab.bpe (as dion-data --tokenizer)")
    p.add_argument("--repeat", type=int, default=10, help="tiktoken runs (median reported)")
    args = p.parse_args()

    raw = open(args.text, "rb").read()
    text = raw.decode("utf-8", errors="replace")
    mb = len(raw) / 1e6

    # tiktoken, single thread.
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(args.gpt2_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(args.gpt2_dir, "encoder.json"))
    enc = tiktoken.Encoding("gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    want = enc.encode_ordinary(text)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        enc.encode_ordinary(text)
        times.append(time.perf_counter() - t0)
    tiktoken_mbps = mb / statistics.median(times)

    # Ours: the ids first (through dion-data encode if it sits beside the benchmark), then speed.
    dion_data = os.path.join(os.path.dirname(os.path.abspath(args.bench)), "dion-data")
    if os.path.exists(dion_data):
        r = subprocess.run([dion_data, "encode", "--tokenizer", args.gpt2_dir, args.text],
                           capture_output=True, check=True)
        same = [int(x) for x in r.stdout.split()] == want
    else:
        same = None
    r = subprocess.run([args.bench, "--text", args.text, "--tokenizer", args.gpt2_dir,
                        "--benchmark_format=json"], capture_output=True, text=True, check=True)
    ours = {b["name"].split("/")[0]: b["bytes_per_second"] / 1e6 for b in json.loads(r.stdout)["benchmarks"]}

    print(f"text: {args.text} ({len(raw):,} bytes, {len(want):,} tokens)")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; tiktoken {tiktoken.__version__}; "
          f"single thread")
    print(f"ids identical to tiktoken: {same if same is not None else 'not checked (no dion-data)'}")
    print()
    print(f"| tokenizer                              | MB/s   | vs tiktoken |")
    print(f"|----------------------------------------|--------|-------------|")
    label = f"tiktoken {tiktoken.__version__} encode_ordinary"
    print(f"| {label:<38} | {tiktoken_mbps:6.2f} | 1.00x       |")
    for name, label in [("BM_EncodeColdCache", "dion encode_ordinary, fresh cache"),
                        ("BM_EncodeWarmCache", "dion encode_ordinary, warm cache")]:
        print(f"| {label:<38} | {ours[name]:6.2f} | {ours[name] / tiktoken_mbps:5.2f}x      |")
    print(f"| {'dion decode':<38} | {ours['BM_Decode']:6.1f} |             |")
    return 0 if same in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
