"""Files written by the C++ library, read by the ecosystem's own Python readers.

- safetensors: the file dion_safetensors writes (tests/train/io/trainio_tool.cpp,
  safetensors-write: every dtype, a transposed matrix, a scalar, an empty tensor, metadata) is
  loaded with the `safetensors` package into torch tensors and compared bit for bit with the
  same values built here; and a file the `safetensors` package writes goes through our
  load_safetensors + save_safetensors (safetensors-copy) and comes back unchanged.
- TensorBoard: the event file dion_tb writes (tensorboard-write) is read with the `tensorboard`
  package's EventAccumulator (which checks every record's CRC); every scalar is there with its
  step and its value as float32. Skipped, with the reason, when `tensorboard` is not installed.
"""
import glob
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "complex64"]


def as_bytes(t):
    """The tensor's bytes (compares every dtype, NaN payloads and float8 codes included)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def expected_tensors():
    """What trainio_tool safetensors-write stores (see trainio_tool.cpp)."""
    t = {name: torch.arange(24, dtype=torch.float64).reshape(2, 3, 4).to(getattr(torch, name))
         for name in DTYPES}
    t["transposed"] = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    t["scalar"] = torch.tensor(3.5, dtype=torch.float32)
    t["empty"] = torch.zeros(0, 3, dtype=torch.int64)
    return t


# ---------------------------------------------------------------------------- safetensors

def test_cpp_file_read_by_safetensors(tmp_path, trainio_tool):
    path = tmp_path / "cpp.safetensors"
    trainio_tool("safetensors-write", path)
    got = load_file(str(path))
    want = expected_tensors()
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, name
        assert g.shape == w.shape, name
        assert as_bytes(g) == as_bytes(w), name
    assert torch.equal(got["float32"], torch.arange(24, dtype=torch.float32).reshape(2, 3, 4))
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"producer": "trainio_tool", "step": "42"}


def test_python_file_through_cpp_unchanged(tmp_path, trainio_tool):
    g = torch.Generator().manual_seed(0)
    src = {
        "w": torch.randn(5, 7, generator=g),
        "w_bf16": torch.randn(4, 4, generator=g).to(torch.bfloat16),
        "w_f16": torch.randn(3, generator=g).to(torch.float16),
        "ids": torch.randint(-1000, 1000, (6,), generator=g, dtype=torch.int64),
        "idx32": torch.randint(0, 50000, (2, 3), generator=g, dtype=torch.int32),
        "tokens": torch.randint(0, 50304, (9,), generator=g, dtype=torch.int64).to(torch.uint16),
        "mask": torch.rand(8, generator=g) > 0.5,
        "scalar": torch.tensor(2.25, dtype=torch.float64),
        "nothing": torch.zeros(0, dtype=torch.float32),
    }
    a, b = tmp_path / "py.safetensors", tmp_path / "copy.safetensors"
    save_file(src, str(a), metadata={"origin": "python"})
    trainio_tool("safetensors-copy", a, b)
    got = load_file(str(b))
    assert sorted(got) == sorted(src)
    for name, w in src.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        assert as_bytes(got[name]) == as_bytes(w), name
    with safe_open(str(b), framework="pt") as f:
        assert f.metadata() == {"origin": "python"}


# ---------------------------------------------------------------------------- TensorBoard

def test_cpp_events_read_by_tensorboard(tmp_path, trainio_tool):
    # requirements.txt installs tensorboard (scripts/setup.sh): its absence is a failure
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing import event_file_loader

    logdir = tmp_path / "tb"
    path = trainio_tool("tensorboard-write", logdir).strip()
    assert glob.glob(str(logdir / "events.out.tfevents.*")) == [path]

    # Every record, CRCs checked by TensorBoard's own reader: file_version, then one per scalar.
    events = list(event_file_loader.EventFileLoader(path).Load())
    assert len(events) == 1 + 50 * 2 + 5
    assert events[0].file_version == "brain.Event:2"

    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["train/loss", "train/lr", "val/loss"]
    steps = np.arange(50)
    want = {
        "train/loss": (steps, 10.0 / (1.0 + steps)),
        "train/lr": (steps, 0.001 * steps),
        "val/loss": (steps[::10], 5.0 - 0.1 * steps[::10]),
    }
    for tag, (s, v) in want.items():
        got = acc.Scalars(tag)
        assert [e.step for e in got] == list(s), tag
        # Stored as float32 (simple_value): equal to the float32 rounding of the double.
        assert [np.float32(e.value) for e in got] == list(v.astype(np.float32)), tag
        times = [e.wall_time for e in got]
        assert times == sorted(times) and times[0] > 1.6e9, tag
