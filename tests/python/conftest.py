"""Shared helpers for the dion_cpp tests: a small safetensors reader (numpy only) and the
locations of the committed reference vectors (tests/reference/make_vectors.py wrote them).

Run: PYTHONPATH=build/python TORCH_COMPILE_DISABLE=1 python3 -m pytest -q tests/python
(ctest -R python_tests does the same).
"""
import json
import os
import struct

# The reference package (when importable) compiles its kernels with torch.compile unless told not to.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

import exact_env  # noqa: E402  (before torch's first kernel: DION_TEST_ENV, the exact pins)

exact_env.apply_test_env()
if os.environ.get("DION_REF_EXACT"):
    exact_env.pin_variables()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

REFERENCE_DIR = os.path.join(os.path.dirname(__file__), "..", "vectors", "reference")

_DTYPES = {"F32": (np.float32, None), "F64": (np.float64, None), "I64": (np.int64, None),
           "BF16": (np.uint16, torch.bfloat16)}


def load_safetensors(path):
    """{name: tensor}, metadata dict. Format: u64 header length, JSON header, raw bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        np_dtype, view = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + start:base + end], dtype=np_dtype).reshape(info["shape"])
        t = torch.from_numpy(arr.copy())
        tensors[name] = t.view(view) if view is not None else t
    return tensors, meta


def reference_cases():
    return sorted(f[:-len(".safetensors")] for f in os.listdir(REFERENCE_DIR)
                  if f.endswith(".safetensors"))


def rel_diff(actual, expected):
    """max |a - e| / max |e| in float64 (the C++ reference test's measure)."""
    a, e = actual.double(), expected.double()
    scale = e.abs().max().item()
    d = (a - e).abs().max().item()
    return d / scale if scale > 0 else d


def align_columns(actual, expected):
    """Flip each column of `actual` to the sign of `expected`'s (QR sign freedom of Dion's Q)."""
    dot = (actual.double() * expected.double()).sum(0, keepdim=True)
    return actual.double() * torch.where(dot < 0, -1.0, 1.0)


@pytest.fixture(autouse=True)
def _one_thread():
    # Reference vectors were recorded with one thread; keep reductions in the same order. Under
    # DION_REF_EXACT the rest of the exact environment too (oneDNN off: exact_env.py).
    n = torch.get_num_threads()
    if os.environ.get("DION_REF_EXACT"):
        exact_env.pin_switches(torch)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
