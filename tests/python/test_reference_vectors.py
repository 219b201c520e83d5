"""dion_cpp against microsoft/dion, through the committed vectors (no reference needed).

Each tests/data/reference/<case>.safetensors holds a case description (the optimizer class,
its constructor keywords, the param groups with the reference's keys), the initial
parameters, every step's gradients, and the reference's parameters and state after every
step. We rebuild the same optimizer from dion_cpp with the same keywords and groups (so the
Python constructor and group-key handling are exercised too), replay the gradients and compare
after every step. Tolerances are the C++ test's (tests/test_reference.cpp): 1e-5 relative in
float32 (orthogonalization runs in bf16 on both sides, same order of operations), 1e-2 for
bf16 tensors (bf16 ulp is about 8e-3); Dion's Q is compared up to the sign of each column.
"""
import json

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


@pytest.mark.parametrize("name", reference_cases())
def test_matches_reference_vectors(name):
    st, meta = load_safetensors(f"{REFERENCE_DIR}/{name}.safetensors")
    case = json.loads(meta["case"])
    n = len(case["shapes"])
    params = [torch.nn.Parameter(st[f"p{i}.init"].clone()) for i in range(n)]

    torch.manual_seed(case["seed"] + 1000)  # legacy Dion draws Q (and its sketches) from here
    opt = build(case, params)
    if case["optimizer"] == "Dion":
        opt.init_state()
        for i, p in enumerate(params):
            if f"st{i}.Q.s0" in st:
                # Same generator (libtorch's default CPU generator), same draw order.
                assert torch.equal(opt.state[p]["Q"], st[f"st{i}.Q.s0"]), f"st{i}.Q.s0"

    tol = 1e-2 if case["dtype"] == "bfloat16" else 1e-5
    for t in range(1, case["steps"] + 1):
        for i, p in enumerate(params):
            g = st.get(f"g{i}.s{t}")
            p.grad = None if g is None else g.clone()
        opt.step()
        for i, p in enumerate(params):
            expected = st[f"p{i}.s{t}"]
            assert rel_diff(p.detach(), expected) <= tol, f"{name} p{i}.s{t}"
            for key in STATE_KEYS:
                ref = st.get(f"st{i}.{key}.s{t}")
                if ref is None:
                    continue
                ours = opt.state[p][key]
                assert ours.shape == ref.shape, f"{name} st{i}.{key}.s{t}"
                if key == "Q":
                    ours = align_columns(ours, ref)
                tol_here = 1e-2 if ref.dtype == torch.bfloat16 else tol
                assert rel_diff(ours, ref) <= tol_here, f"{name} st{i}.{key}.s{t}"
        assert all(g["step"] == t for g in opt.param_groups)
