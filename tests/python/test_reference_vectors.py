"""dion_cpp against microsoft/dion, through the committed vectors (no reference needed).

Each tests/data/reference/<case>.safetensors holds a case description (the optimizer class,
its constructor keywords, the param groups with the reference's keys), the initial
parameters, every step's gradients, and the reference's parameters and state after every
step. We rebuild the same optimizer from dion_cpp with the same keywords and groups (so the
Python constructor and group-key handling are exercised too), replay the gradients and compare
after every step.

Exactness, as in the C++ test (tests/test_reference.cpp explains): in the environment the
vectors were recorded in (metadata: scalar ATen kernels ATEN_CPU_CAPABILITY=default,
MKL_CBWR=COMPATIBLE, one thread, the same torch and machine) every tensor must match exactly
(max |diff| == 0; ctest's python_reference_exact runs this file so, with DION_REF_EXACT=1 making
a differing environment a failure). Elsewhere the C++ test's tolerances: 1e-6 relative for fp32
tensors, 1e-4 for legacy Dion's Q (up to column signs) and for fp32 tensors of cases with bf16
parameters or state, 1e-2 for bf16 tensors (about one bf16 ulp); legacy Dion's initial Q is then
loaded from the recording (randn differs by instruction set).
"""
import json
import os
import platform

import pytest
import torch

import dion_cpp
from conftest import REFERENCE_DIR, align_columns, load_safetensors, reference_cases, rel_diff

STATE_KEYS = ("momentum", "variance", "variance_neuron", "Q", "step_dev")


def build(case, params):
    cls = getattr(dion_cpp, case["optimizer"])
    ctor = dict(case["ctor"])
    if ctor.pop("mixed_precision", None) == "bfloat16":
        ctor["mixed_precision_config"] = dion_cpp.DionMixedPrecisionConfig(
            momentum_dtype=torch.bfloat16, Q_dtype=torch.bfloat16)
    groups = [{"params": [params[i] for i in g["params"]], **g["options"]} for g in case["groups"]]
    return cls(groups, **ctor)


def exact_environment(case):
    """'' when this process runs the kernels the case was recorded with, else what differs."""
    here = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine()}
    for key, value in here.items():
        if case.get(key) != value:
            return f"{key} is {value!r} here, {case.get(key)!r} when recorded"
    return ""


def tolerance(case, key, dtype, exact):
    if exact:
        return 0.0
    if dtype == torch.bfloat16:
        return 1e-2
    if key == "Q" or case["dtype"] == "bfloat16" or "mixed_precision" in case["ctor"]:
        return 1e-4
    return 1e-6


@pytest.mark.parametrize("name", reference_cases())
def test_matches_reference_vectors(name):
    st, meta = load_safetensors(f"{REFERENCE_DIR}/{name}.safetensors")
    case = json.loads(meta["case"])
    n = len(case["shapes"])
    params = [torch.nn.Parameter(st[f"p{i}.init"].clone()) for i in range(n)]

    torch.manual_seed(case["seed"] + 1000)  # legacy Dion draws Q (and its sketches) from here
    opt = build(case, params)
    why = exact_environment(case)
    exact = not why
    if os.environ.get("DION_REF_EXACT") and not exact:
        pytest.fail(f"DION_REF_EXACT is set but this environment cannot reproduce the vectors bit for bit: {why}")
    if case["optimizer"] == "Dion":
        opt.init_state()
        for i, p in enumerate(params):
            if f"st{i}.Q.s0" in st:
                if exact:  # same generator (libtorch's default CPU generator), same draw order
                    assert torch.equal(opt.state[p]["Q"], st[f"st{i}.Q.s0"]), f"st{i}.Q.s0"
                else:
                    opt.state[p]["Q"].copy_(st[f"st{i}.Q.s0"])

    for t in range(1, case["steps"] + 1):
        for i, p in enumerate(params):
            g = st.get(f"g{i}.s{t}")
            p.grad = None if g is None else g.clone()
        opt.step()
        for i, p in enumerate(params):
            expected = st[f"p{i}.s{t}"]
            assert p.dtype == expected.dtype
            assert rel_diff(p.detach(), expected) <= tolerance(case, "p", expected.dtype, exact), f"{name} p{i}.s{t}"
            for key in STATE_KEYS:
                ref = st.get(f"st{i}.{key}.s{t}")
                if ref is None:
                    continue
                ours = opt.state[p][key]
                assert ours.shape == ref.shape, f"{name} st{i}.{key}.s{t}"
                assert ours.dtype == ref.dtype, f"{name} st{i}.{key}.s{t}"
                if key == "Q" and not exact:
                    ours = align_columns(ours, ref)
                assert rel_diff(ours, ref) <= tolerance(case, key, ref.dtype, exact), f"{name} st{i}.{key}.s{t}"
        assert all(g["step"] == t for g in opt.param_groups)
