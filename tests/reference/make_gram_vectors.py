#!/usr/bin/env python3
"""Record what the gram-newton-schulz package computes, for tests/math/test_ortho_fast.cpp.

The reference's use_gram_newton_schulz=True calls gram_newton_schulz.GramNewtonSchulz
(use_gram_newton_schulz=True, gram_newton_schulz_reset_iterations=[2]). This script runs that
class on CPU with its torch backend (ns_use_kernels=False) and without torch.compile
(compile_kwargs=None), in the package's own compute dtype (float16), and writes inputs and
outputs to one safetensors file. It needs the package (pip install gram-newton-schulz==0.1.6);
the vectors it wrote are data, the package's code is not part of this repository.

    python3 tests/reference/make_gram_vectors.py --out tests/vectors/gram/gram_newton_schulz.safetensors
"""
import argparse
import json

import torch
from safetensors.torch import save_file

CASES = [  # name, batch, m, n
    ("wide", 2, 64, 256),
    ("tall", 1, 192, 48),
    ("square", 1, 96, 96),
    ("wide_1to3", 1, 100, 300),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import gram_newton_schulz as gns
    torch.set_num_threads(1)
    f = gns.GramNewtonSchulz(ns_use_kernels=False, use_gram_newton_schulz=True,
                             gram_newton_schulz_reset_iterations=[2], compile_kwargs=None)
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, b, m, n in CASES:
        G = torch.randn(b, m, n, generator=gen)
        tensors[f"{name}.G"] = G
        tensors[f"{name}.U"] = f(G.clone()).float()  # the package returns the input dtype
    meta = {"package": f"gram-newton-schulz {gns.__version__}", "torch": torch.__version__,
            "compute_dtype": "float16", "cases": json.dumps(CASES)}
    save_file(tensors, args.out, metadata=meta)


if __name__ == "__main__":
    main()
