"""Scheduled runs: one optimizer class under a torch.optim LR scheduler, the same for the
reference (microsoft/dion) and dion_cpp.

What it is: the case list and the run itself, shared by the recorder
(tests/reference/make_scheduler_vectors.py, which runs the reference and writes
tests/vectors/reference/scheduled/<case>.safetensors) and the tests (test_scheduled.py replays
the vectors through dion_cpp; test_live_reference.py runs both side by side when the reference
is importable). A run: parameters and gradients drawn from a seed, groups of matrices plus an
adamw and a lion vector group, the scheduler stepped after every optimizer step, the
parameters, every group's lr and the optimizer state recorded after every step.

What it is not: no comparison (the tests compare).

Why it matters: the reference keeps group["lr"] as a 0-d float32 tensor (legacy Dion: a float),
so a scheduler computes each new lr in float32 tensor arithmetic; computed in Python floats it
differs by one float32 ulp on some steps and the runs drift apart.
"""
import math

import torch

SHAPES = [(8, 16), (16, 8), (12,), (4,)]
STEPS = 30
STATE_KEYS = ("momentum", "variance", "variance_neuron", "Q", "step_dev")


def train_py_lambda(num_iterations, warmup_ratio=0.1, warmdown_ratio=0.5):
    """microsoft/dion's train.py get_lr (linear warmup, constant, linear warmdown)."""
    def get_lr(it):
        warmup_iters = round(warmup_ratio * num_iterations)
        warmdown_iters = round(warmdown_ratio * num_iterations)
        if it < warmup_iters:
            return (it + 1) / warmup_iters
        elif it <= num_iterations - warmdown_iters:
            return 1.0
        else:
            return (num_iterations - it) / warmdown_iters
    return get_lr


def make_scheduler(opt, spec):
    kind = spec["kind"]
    if kind == "train_py":
        return torch.optim.lr_scheduler.LambdaLR(opt, train_py_lambda(STEPS))
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=spec["eta_min"])
    if kind == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec["max_lr"], total_steps=STEPS,
                                                   cycle_momentum=False)
    raise ValueError(f"unknown scheduler kind {kind!r}")


def _case(name, optimizer, ctor, scheduler):
    return dict(case=name, optimizer=optimizer, ctor=ctor, scheduler=scheduler, steps=STEPS,
                shapes=[list(s) for s in SHAPES], seed=len(name),
                groups=[{"params": [0, 1], "options": {}},
                        {"params": [2], "options": {"algorithm": "adamw", "lr": 0.003}},
                        {"params": [3], "options": {"algorithm": "lion", "lr": 0.0007}}])


TRAIN_PY = {"kind": "train_py"}
CASES = [
    _case("muon_train_py", "Muon", {"lr": 0.02}, TRAIN_PY),
    _case("normuon_train_py", "NorMuon", {"lr": 0.02}, TRAIN_PY),
    _case("dion2_train_py", "Dion2", {"lr": 0.02, "fraction": 0.5}, TRAIN_PY),
    _case("nordion2_train_py", "NorDion2", {"lr": 0.02, "fraction": 0.5}, TRAIN_PY),
    _case("dion_train_py", "Dion", {"lr": 0.02, "rank_fraction": 0.5}, TRAIN_PY),
    _case("muon_cosine", "Muon", {"lr": 0.013}, {"kind": "cosine", "eta_min": 0.001}),
    _case("dion2_onecycle", "Dion2", {"lr": 0.01}, {"kind": "onecycle", "max_lr": 0.03}),
    _case("dion_cosine", "Dion", {"lr": 0.013}, {"kind": "cosine", "eta_min": 0.001}),
]


def initial_values(case):
    """Initial parameters and every step's gradients, drawn from the case's seed."""
    gen = torch.Generator().manual_seed(case["seed"])
    init = [torch.randn(s, generator=gen) * 0.5 for s in case["shapes"]]
    grads = [[torch.randn(s, generator=gen) for s in case["shapes"]] for _ in range(case["steps"])]
    return init, grads


def run(module, case, init, grads, lrs=None):
    """Run `case` with `module`'s optimizer class (dion or dion_cpp): returns {name: tensor}
    with p{i}.s{t}, lr{g}.s{t} (float32; s0: before step 1) and st{i}.{key}.s{t}. With `lrs` ({lr{g}.s{t}: 0-d
    tensor}, a recorded run's) no scheduler runs: each group's lr is set by hand to the
    recorded value before every step, as `group["lr"] = value` (its lr{g}.s{t} then are the
    lrs set before step t + 1, not the recorded ones)."""
    params = [torch.nn.Parameter(v.clone()) for v in init]
    groups = [{"params": [params[i] for i in g["params"]], **g["options"]} for g in case["groups"]]
    torch.manual_seed(case["seed"] + 1000)  # legacy Dion draws Q and its sketches from here
    opt = getattr(module, case["optimizer"])(groups, **case["ctor"])
    if case["optimizer"] == "Dion":
        # Legacy Dion draws Q when it creates state; do it now, in the same order on both sides
        # (lazily at step 1 the two interleave the Q draws with the sketches differently).
        if hasattr(opt, "init_state"):
            opt.init_state()
        else:
            for group in opt.param_groups:
                for p in group["params"]:
                    opt._get_or_initialize_state(p, group)
    sched = make_scheduler(opt, case["scheduler"]) if lrs is None else None
    out = {}
    for g, group in enumerate(opt.param_groups):  # what the scheduler's construction set
        out[f"lr{g}.s0"] = torch.tensor(float(group["lr"]), dtype=torch.float32)
    for t in range(1, case["steps"] + 1):
        for p, g in zip(params, grads[t - 1]):
            p.grad = g.clone()
        if lrs is not None:
            for g, group in enumerate(opt.param_groups):
                group["lr"] = lrs[f"lr{g}.s{t - 1}"].item()
        opt.step()
        if sched is not None:
            sched.step()
        for i, p in enumerate(params):
            out[f"p{i}.s{t}"] = p.detach().clone()
            for key in STATE_KEYS:
                value = opt.state[p].get(key)
                if isinstance(value, torch.Tensor):
                    out[f"st{i}.{key}.s{t}"] = value.detach().clone()
        for g, group in enumerate(opt.param_groups):
            out[f"lr{g}.s{t}"] = torch.tensor(float(group["lr"]), dtype=torch.float32)
    return out


def python_float_lrs(case):
    """The lr sequence a scheduler computes when group["lr"] is a Python float (what
    dion_cpp did before it kept the reference's tensor), rounded to float32: the test checks
    that the recorded sequence differs from it somewhere, so the vectors exercise the rounding."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))],
               "lr": g["options"].get("lr", case["ctor"]["lr"])} for g in case["groups"]]
    opt = torch.optim.SGD(groups, lr=case["ctor"]["lr"])
    sched = make_scheduler(opt, case["scheduler"])
    out = {}
    for t in range(1, case["steps"] + 1):
        opt.step()
        sched.step()
        for g, group in enumerate(opt.param_groups):
            out[f"lr{g}.s{t}"] = torch.tensor(group["lr"], dtype=torch.float32)
    assert not math.isnan(float(out[f"lr0.s{case['steps']}"]))
    return out
