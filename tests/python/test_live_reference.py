"""dion_cpp against microsoft/dion itself, step by step.

Needs the reference importable: ctest runs it as `python_live_reference` only when the build is
configured with -DDION_REFERENCE_DIR=/path/to/microsoft/dion (a checkout; never part of this
repository), and python_tests leaves it out; without the reference it fails, naming it.
test_reference_vectors.py covers the same ground from recorded vectors. With the reference on
PYTHONPATH, every public
class is built twice with the same keywords and groups (matrices in one group, a vector each
in an adamw and a lion group), fed the same gradients, and compared after every step:
parameters and every state tensor the reference keeps. Legacy Dion draws Q and its sketches
from the global generator, so the generator is re-seeded before each side's state
initialization and each step. Tolerance 1e-5 relative, as in test_reference_vectors.py.
"""
import pytest
import torch

import dion_cpp
import scheduled_runs
from test_scheduled import assert_same_run
from conftest import align_columns, rel_diff

try:
    import dion
except ImportError as e:  # a collection error names what is missing and how to get it
    raise ImportError("the reference package microsoft/dion is not importable: configure with "
                      "-DDION_REFERENCE_DIR=/path/to/a/checkout (ctest python_live_reference), or put "
                      "one on PYTHONPATH") from e

CASES = [
    ("Muon", {"nesterov": True, "lr": 0.02}),
    ("NorMuon", {"muon_beta2": 0.9}),
    ("Dion2", {"fraction": 0.5}),
    ("NorDion2", {"fraction": 0.5, "mu": 0.9}),
    ("Dion3", {}),
    ("Dion", {"rank_fraction": 0.5}),
]
SHAPES = [(16, 32), (16, 32), (32, 16), (24,), (8,)]
# Param-group keys that dion-cpp adds to a class's groups (its own options; the reference has none).
OUR_GROUP_KEYS = {"Dion2": {"selection_dim"}}


def make(module, name, ctor, values):
    params = [torch.nn.Parameter(v.clone()) for v in values]
    groups = [{"params": params[:3]},
              {"params": [params[3]], "algorithm": "adamw", "lr": 0.003},
              {"params": [params[4]], "algorithm": "lion", "lr": 0.001}]
    torch.manual_seed(7)
    opt = getattr(module, name)(groups, **ctor)
    if name == "Dion":  # legacy Dion: create state (draw Q) now, in the same order on both sides
        for group in opt.param_groups:
            for p in group["params"]:
                if module is dion:
                    opt._get_or_initialize_state(p, group)
        if module is dion_cpp:
            opt.init_state()
    return opt, params


def step_both(gen, seed, ref, ref_params, ours, our_params):
    """Same fresh gradients on both sides, then one step each from the same generator state."""
    for rp, op in zip(ref_params, our_params):
        g = torch.randn(rp.shape, generator=gen)
        rp.grad, op.grad = g.clone(), g.clone()
    torch.manual_seed(seed)
    ref.step()
    torch.manual_seed(seed)
    ours.step()


@pytest.mark.parametrize("name,ctor", CASES, ids=[c[0] for c in CASES])
def test_step_by_step_equals_reference(name, ctor):
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen) * 0.5 for s in SHAPES]
    ref, ref_params = make(dion, name, ctor, values)
    ours, our_params = make(dion_cpp, name, ctor, values)
    for step in range(1, 5):
        step_both(gen, 100 + step, ref, ref_params, ours, our_params)
        for i, (rp, op) in enumerate(zip(ref_params, our_params)):
            assert rel_diff(op.detach(), rp.detach()) <= 1e-5, f"{name} param {i} step {step}"
            for key, rv in ref.state[rp].items():
                if not isinstance(rv, torch.Tensor):
                    continue
                ov = ours.state[op][key]
                if key == "Q":
                    ov = align_columns(ov, rv)
                assert rel_diff(ov, rv) <= 1e-5, f"{name} state {key} of param {i} step {step}"
            ref_keys = {k for k, v in ref.state[rp].items() if isinstance(v, torch.Tensor)}
            if name == "Dion" and "variance" in ref_keys:
                # Legacy Dion's AdamW counts steps on the host; ours keeps step_dev as the
                # other classes do (load_state_dict rebuilds it from group["step"]).
                ref_keys.add("step_dev")
            assert set(ours.state[op]) == ref_keys, f"{name} state keys of param {i}"
        assert [g["step"] for g in ours.param_groups] == [g["step"] for g in ref.param_groups]
        # Same param-group keys as the reference (what state_dict() writes), plus dion-cpp's own
        # options where the class has them (docs/optimizers.md: selection_dim, dion2's choice of
        # selection dim on sharded matrices).
        extra = OUR_GROUP_KEYS.get(name, set())
        assert [set(g) - extra for g in ours.param_groups] == [set(g) for g in ref.param_groups]


@pytest.mark.parametrize("name,ctor", CASES, ids=[c[0] for c in CASES])
def test_loads_reference_checkpoint(name, ctor):
    """A reference optimizer's state_dict() loads into ours and both continue identically."""
    gen = torch.Generator().manual_seed(1)
    values = [torch.randn(s, generator=gen) * 0.5 for s in SHAPES]
    ref, ref_params = make(dion, name, ctor, values)
    for _ in range(2):
        for p in ref_params:
            p.grad = torch.randn(p.shape, generator=gen)
        ref.step()
    ours, our_params = make(dion_cpp, name, ctor, [p.detach() for p in ref_params])
    ours.load_state_dict(ref.state_dict())
    for step in range(2):
        step_both(gen, 200 + step, ref, ref_params, ours, our_params)
    for i, (rp, op) in enumerate(zip(ref_params, our_params)):
        assert rel_diff(op.detach(), rp.detach()) <= 1e-5, f"{name} param {i}"


@pytest.mark.parametrize("name", [c["case"] for c in scheduled_runs.CASES])
def test_scheduled_run_bit_identical_to_reference(name):
    """Each class under an LR scheduler (train.py's warmup/warmdown lambda, cosine, one-cycle):
    parameters, state and group lrs equal the reference's exactly after every step."""
    case = next(c for c in scheduled_runs.CASES if c["case"] == name)
    init, grads = scheduled_runs.initial_values(case)
    ref = scheduled_runs.run(dion, case, init, grads)
    ours = scheduled_runs.run(dion_cpp, case, init, grads)
    assert_same_run(name, case, ours, ref)
