#!/usr/bin/env python3
"""tests/train/make_gpt_reference.py — the reference GPT's numbers that tests/train/model/test_gpt.cpp
checks our C++ GPT against. Dev-time only: it imports microsoft/dion's models/gpt_model.py
(never committed here) from PYTHONPATH.

    git -C <dion mirror> archive HEAD | tar -x -C /tmp/dion_ref
    PYTHONPATH=/tmp/dion_ref TORCH_COMPILE_DISABLE=1 python3 tests/train/make_gpt_reference.py           # write
    PYTHONPATH=/tmp/dion_ref TORCH_COMPILE_DISABLE=1 python3 tests/train/make_gpt_reference.py --check   # compare

What it records (tests/vectors/train/gpt_reference.json):
  - the 160M config's parameter count (GPT built on the meta device);
  - for a small GPT (2 layers, 64 wide, 4 heads, T 32): the model built on the meta device,
    moved to CPU, torch.manual_seed(SEED), model.init_weights() — the reference's own init —
    then the first 4 values of every parameter (so the C++ test proves it draws the SAME weights
    from the same seed), and the fp32 loss on a fixed batch (tokens (b*7919 + t*104729) % 50257)
    with all weights as drawn, and after scaling every weight by 3 (a larger, less uniform loss).
Without the reference importable it prints why and exits 0 (a skip), writing nothing.
"""
import json
import os
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vectors", "train", "gpt_reference.json")
SEED = 1234
SMALL = dict(sequence_len=32, vocab_size=50304, n_layer=2, n_head=4, n_embd=64)
B, T = 2, 32


def batch(torch):
    b = torch.arange(B).view(B, 1)
    t = torch.arange(T + 1).view(1, T + 1)
    tok = (b * 7919 + t * 104729) % 50257
    return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()


def compute():
    import torch
    try:
        from models.gpt_model import GPT, GPTConfig
    except ImportError as e:
        print(f"SKIP: the reference's models/gpt_model.py is not importable ({e}); set PYTHONPATH to a "
              "checkout of microsoft/dion")
        sys.exit(0)
    with torch.device("meta"):
        big = GPT(GPTConfig(sequence_len=1024, vocab_size=50304, n_layer=12, n_head=6, n_embd=768))
    count_160m = sum(p.numel() for p in big.parameters())

    with torch.device("meta"):
        model = GPT(GPTConfig(**SMALL))
    model.to_empty(device="cpu")
    torch.manual_seed(SEED)
    model.init_weights()
    first = {name: p.detach().flatten()[:4].tolist() for name, p in model.named_parameters()}
    x, y = batch(torch)
    with torch.no_grad():
        loss = model(x, y).item()
        for p in model.parameters():
            p.mul_(3.0)
        loss_scaled = model(x, y).item()
    return {
        "torch": torch.__version__,
        "param_count_160m": count_160m,
        "seed": SEED,
        "config": SMALL,
        "batch": {"B": B, "T": T, "tokens": "(b*7919 + t*104729) % 50257, x = t < T, y = t >= 1"},
        "first_values": first,
        "loss": loss,
        "loss_weights_x3": loss_scaled,
    }


def main():
    got = compute()
    if "--check" in sys.argv:
        with open(OUT) as f:
            saved = json.load(f)
        ok = saved["param_count_160m"] == got["param_count_160m"] and saved["first_values"] == got["first_values"]
        for key in ("loss", "loss_weights_x3"):
            diff = abs(saved[key] - got[key])
            print(f"{key}: saved {saved[key]!r} reference now {got[key]!r} |diff| {diff:.3g}")
            ok = ok and diff <= 2e-5
        print("OK" if ok else "MISMATCH")
        sys.exit(0 if ok else 1)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(got, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: 160M params {got['param_count_160m']}, loss {got['loss']!r}, x3 {got['loss_weights_x3']!r}")


if __name__ == "__main__":
    main()
