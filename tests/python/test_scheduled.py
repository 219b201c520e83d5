"""dion_cpp under torch.optim LR schedulers, against recorded reference runs.

tests/vectors/reference/scheduled/<case>.safetensors (tests/reference/make_scheduler_vectors.py)
holds a reference run of 30 steps under a scheduler (train.py's warmup/warmdown LambdaLR,
CosineAnnealingLR, OneCycleLR): every step's gradients, parameters and group lrs, and the state
every 10th step. The same run through dion_cpp (tests/python/scheduled_runs.py):

- sees exactly the reference's lr on every step (group["lr"] is kept as the reference keeps it:
  a 0-d float32 tensor for the DistributedOrthoBase family, a float for legacy Dion), checked
  bit for bit; with Python floats some steps' lrs differ by one float32 ulp, and
  test_vectors_exercise_float32_lr_rounding checks that the recorded runs contain such steps;
- steps with exactly those lrs: equal, bit for bit, to a dion_cpp run whose lrs are set by hand
  to the recorded values;
- lands on the reference's parameters and state. On the machine that recorded them (an Intel
  Xeon) the difference is exactly 0, and test_live_reference.py asserts 0 wherever the reference
  is importable. Here the tolerance is 5e-4 relative: the reference's own results depend on the
  CPU's BLAS kernels (its normuon_basic case re-recorded on that Xeon differs from the committed
  Zen 4 recording by 1.9e-5 after 5 steps), and these runs are 30 steps long. A wrong schedule
  is far outside it (a constant lr instead: see test_tolerance_catches_a_wrong_schedule).

Legacy Dion draws Q when it creates state: both sides create it right after construction
(scheduled_runs.run), so the draws come in the same order; Q is compared up to column signs.
"""
import json
import os

import pytest
import torch

import dion_cpp
import scheduled_runs
from conftest import REFERENCE_DIR, align_columns, load_safetensors, rel_diff

SCHEDULED_DIR = os.path.join(REFERENCE_DIR, "scheduled")
CASES = {c["case"]: c for c in scheduled_runs.CASES}


def recorded(name):
    st, meta = load_safetensors(os.path.join(SCHEDULED_DIR, f"{name}.safetensors"))
    case = json.loads(meta["case"])
    n, steps = len(case["shapes"]), case["steps"]
    init = [st[f"p{i}.init"] for i in range(n)]
    grads = [[st[f"g{i}.s{t}"] for i in range(n)] for t in range(1, steps + 1)]
    return case, st, init, grads


def test_every_case_is_recorded():
    files = sorted(f[:-len(".safetensors")] for f in os.listdir(SCHEDULED_DIR) if f.endswith(".safetensors"))
    assert files == sorted(CASES)


TOLERANCE = 5e-4  # relative, across CPUs (see the module docstring)


def run_recorded(name):
    case, st, init, grads = recorded(name)
    assert {k: v for k, v in case.items() if k in CASES[name]} == CASES[name], "case changed: re-record"
    expected = {k: v for k, v in st.items() if not k.endswith(".init") and not k.startswith("g")}
    return case, expected, scheduled_runs.run(dion_cpp, case, init, grads), init, grads


@pytest.mark.parametrize("name", sorted(CASES))
def test_scheduled_run_matches_reference(name):
    case, expected, ours, init, grads = run_recorded(name)
    lrs = {k: v for k, v in expected.items() if k.startswith("lr")}
    assert_same_run(name, case, ours, lrs)  # the lrs: bit for bit
    # The C++ steps used exactly those lrs: the same run with the lrs set by hand.
    by_hand = scheduled_runs.run(dion_cpp, case, init, grads, lrs=lrs)
    assert_same_run(name, case, ours, {k: v for k, v in by_hand.items() if not k.startswith("lr")})
    for key, value in expected.items():
        actual = align_columns(ours[key], value) if ".Q." in key else ours[key]
        assert rel_diff(actual, value) <= TOLERANCE, f"{name}: {key}"


def test_tolerance_catches_a_wrong_schedule():
    case, expected, _, init, grads = run_recorded("muon_train_py")
    flat = {k: torch.tensor(case["ctor"]["lr"] if k.startswith("lr0") else v.item()) for k, v in expected.items()
            if k.startswith("lr")}
    wrong = scheduled_runs.run(dion_cpp, case, init, grads, lrs=flat)
    assert max(rel_diff(wrong[k], expected[k]) for k in expected if k.startswith("p")) > 100 * TOLERANCE


def assert_same_run(name, case, ours, expected_run):
    """Every tensor of expected_run bit for bit (Q up to the sign of each column: QR's freedom)."""
    for key, expected in expected_run.items():
        assert key in ours, f"{name}: {key} missing"
        actual = align_columns(ours[key], expected).to(expected.dtype) if ".Q." in key else ours[key]
        assert torch.equal(actual, expected), f"{name}: {key} differs by " \
            f"{(actual.double() - expected.double()).abs().max().item():.3g}"


def test_vectors_exercise_float32_lr_rounding():
    """The recorded lrs differ from what the same scheduler computes over Python floats on some
    steps (else the bitwise test above could not tell the representations apart)."""
    for name in ("muon_train_py", "muon_cosine"):
        case, st, _, _ = recorded(name)
        floats = scheduled_runs.python_float_lrs(case)
        assert any(not torch.equal(st[k], v) for k, v in floats.items()), name


@pytest.mark.parametrize("cls", [dion_cpp.Muon, dion_cpp.NorMuon, dion_cpp.Dion2, dion_cpp.NorDion2])
def test_lr_is_a_persistent_float32_tensor(cls):
    p = torch.nn.Parameter(torch.randn(8, 16))
    opt = cls([p], lr=0.02)
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dtype == torch.float32 and lr.ndim == 0
    opt.param_groups[0]["lr"] = 0.5  # the reference's idiom: refilled into the same tensor
    p.grad = torch.randn(8, 16)
    opt.step()
    assert opt.param_groups[0]["lr"] is lr and lr.item() == 0.5
    sd = opt.state_dict()
    assert type(sd["param_groups"][0]["lr"]) is float  # portable checkpoints, as the reference
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] is lr


def test_legacy_dion_keeps_float_lr():
    opt = dion_cpp.Dion([torch.nn.Parameter(torch.randn(8, 16))], lr=0.02)
    assert type(opt.param_groups[0]["lr"]) is float


def test_tensor_weight_decay_is_live_too():
    """As the reference: a weight_decay given as a Tensor becomes the group's persistent 0-d
    float32 tensor, and a later float assignment refills it."""
    p = torch.nn.Parameter(torch.randn(8, 16))
    opt = dion_cpp.Muon([p], weight_decay=torch.tensor(0.05))
    wd = opt.param_groups[0]["weight_decay"]
    assert isinstance(wd, torch.Tensor) and wd.dtype == torch.float32
    opt.param_groups[0]["weight_decay"] = 0.0
    p.grad = torch.randn(8, 16)
    opt.step()
    assert opt.param_groups[0]["weight_decay"] is wd and wd.item() == 0.0
