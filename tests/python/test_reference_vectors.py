"""dion_cpp against microsoft/dion, through the committed vectors (no reference needed).

Each tests/vectors/reference/<case>.safetensors holds a case description (the optimizer class,
its constructor keywords, the param groups with the reference's keys), the initial
parameters, every step's gradients, and the reference's parameters and state after every
step. We rebuild the same optimizer from dion_cpp with the same keywords and groups (so the
Python constructor and group-key handling are exercised too), replay the gradients and compare
after every step.

Exactness, as in the C++ test (tests/optim/test_reference.cpp explains): in the environment the
vectors were recorded in (exact_env.py: ATen's scalar kernels, oneDNN off, MKL_CBWR=COMPATIBLE,
one thread; the metadata records it) every tensor must match exactly (max |diff| == 0; ctest's
python_reference_exact runs this file so, and python_reference_exact_nonintel again with MKL on
its non-Intel paths, with DION_REF_EXACT=1 making a differing environment a failure). Elsewhere
the C++ test's tolerances, derived there for another CPU: 1e-2 for bf16 tensors (one bf16 ulp);
for the classes that orthogonalize in bf16 (all but legacy Dion) 5e-4 for fp32 tensors (five
flipped bf16 roundings of the update) and 1e-2 for variance_neuron; for legacy Dion 1e-6, 1e-4
for Q (up to column signs) and for the fp32 tensors of its bf16 case. Legacy Dion's initial Q is
then loaded from the recording (randn differs by instruction set).
"""
import json
import os

import pytest
import torch

import dion_cpp
import exact_env
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
    return exact_env.differs(case, torch)


def tolerance(case, key, dtype, exact):
    if exact:
        return 0.0
    if dtype == torch.bfloat16:
        return 1e-2
    if case["optimizer"] != "Dion":  # orthogonalized in bf16: tests/optim/test_reference.cpp derives these
        return 1e-2 if key == "variance_neuron" else 5e-4
    if key == "Q" or case["dtype"] == "bfloat16" or "mixed_precision" in case["ctor"]:
        return 1e-4
    return 1e-6


def test_exact_environment_takes_effect():
    """Under DION_REF_EXACT the pins hold where the kernels are chosen (MKL reports its COMPATIBLE
    branch, oneDNN is off, ATen runs its scalar kernels); elsewhere the machine's own kernels run.
    DION_EXPECT_MKL_NON_INTEL: the preloaded interposer (tests/support/mkl_non_intel.cpp) makes MKL
    take its non-Intel paths."""
    torch.ones(2) @ torch.ones(2, 2)  # MKL initialized
    branch, auto = exact_env.mkl_branches(torch)
    assert branch != -1, "this torch's MKL exports no mkl_serv_cbwr_get: the exact environment cannot check MKL"
    h = exact_env.here(torch)
    if os.environ.get("DION_REF_EXACT"):
        assert (h["cpu_capability"], h["mkldnn"], h["threads"]) == ("DEFAULT", False, 1), h
        assert branch == exact_env.MKL_BRANCH_COMPATIBLE, f"MKL_CBWR=COMPATIBLE did not take (branch {branch})"
    else:
        assert h["mkldnn"], f"the plain tests must run the machine's own kernels: {h}"
    if os.environ.get("DION_EXPECT_MKL_NON_INTEL"):
        assert auto == exact_env.MKL_AUTO_BRANCH_NON_INTEL, f"MKL still takes this CPU for an Intel one (auto branch {auto})"


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
    # The pins took, but this CPU's sqrt may round otherwise than the recording's (exact_env.py):
    # then the classes whose step takes a square root compare with tolerances; the others stay exact.
    if exact and case["optimizer"] in ("NorMuon", "NorDion2", "Dion3", "Dion") and exact_env.unreachable(torch):
        exact = False
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
