"""tests/wheel/smoke.py — one Muon step through whichever dion_cpp `import dion_cpp` finds.

Run twice by tests/wheel/run.sh: first with the build tree's module (PYTHONPATH=build/python,
`--save`), then with the wheel installed in a fresh venv (`--compare`, `--expect-under` the
venv): the installed module must import from the venv and give the same parameters bit for bit
(same sources, same flags, same torch: any difference is a packaging fault, so the tolerance is
zero). Not a test of the math: tests/python does that.
"""
import argparse
import pathlib
import sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--save", help="write the stepped parameter here")
parser.add_argument("--compare", help="a file written by --save: must be equal bit for bit")
parser.add_argument("--expect-under", help="dion_cpp must be imported from below this directory")
args = parser.parse_args()

import dion_cpp  # noqa: E402

where = pathlib.Path(dion_cpp.__file__).resolve()
print(f"smoke: dion_cpp from {where}")
if args.expect_under and pathlib.Path(args.expect_under).resolve() not in where.parents:
    sys.exit(f"smoke: FAILED: dion_cpp imported from {where}, not from under {args.expect_under}")

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(32, 16))  # [m, n]
w0 = w.detach().clone()
w.grad = torch.randn(32, 16)
opt = dion_cpp.Muon([w], lr=0.02)
opt.step()
result = w.detach().clone()
if not torch.isfinite(result).all() or torch.equal(result, w0):
    sys.exit("smoke: FAILED: the Muon step left the parameter unchanged or non-finite")

if args.save:
    torch.save(result, args.save)
    print(f"smoke: saved the stepped [32, 16] parameter to {args.save}")
if args.compare:
    expected = torch.load(args.compare)
    if not torch.equal(result, expected):
        diff = (result - expected).abs().max().item()
        sys.exit(f"smoke: FAILED: differs from {args.compare} (max abs diff {diff:.3e})")
    print(f"smoke: equal bit for bit to {args.compare}")
print("smoke: passed")
