"""dion_cpp's Python classes: training, determinism, state, checkpoints, schedulers, errors.

Every class trains a tiny two-layer regression (a matrix group plus adamw / lion groups for
the biases) and must lower the loss; two identical runs must agree bitwise; the state
exposed in `opt.state` must be the C++ optimizer's live tensors; a state_dict round trip
(also through torch.save) must resume bitwise; torch.optim.lr_scheduler must drive the C++
learning rate; and invalid input must raise the reference's exception types.
"""
import io

import pytest
import torch

import dion_cpp
from dion_cpp import Dion, Dion2, Dion3, NorDion2, Muon, NorMuon

CLASSES = [Muon, NorMuon, Dion2, NorDion2, Dion3, Dion]
IDS = ["Muon", "NorMuon", "Dion2", "NorDion2", "Dion3", "Dion"]


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def make_opt(cls, model, **kw):
    mats = [p for p in model.parameters() if p.ndim == 2]
    vecs = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": mats},
              {"params": vecs[:1], "algorithm": "adamw", "lr": 3e-3},
              {"params": vecs[1:], "algorithm": "lion", "lr": 1e-3}]
    return cls(groups, lr=kw.pop("lr", 0.02), **kw)


def batches(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(16, 8, generator=gen)
    for _ in range(n):
        x = torch.randn(64, 16, generator=gen)
        yield x, x @ target


def train(cls, steps=40, model_seed=0, **kw):
    model = make_model(model_seed)
    opt = make_opt(cls, model, **kw)
    losses = []
    for x, y in batches(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


# ---------------------------------------------------------------------------- training
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_loss_falls_and_is_deterministic(cls):
    model_a, _, losses = train(cls, steps=60, lr=0.1)
    assert sum(losses[-5:]) / 5 < 0.3 * losses[0], losses
    model_b, _, losses_b = train(cls, steps=60, lr=0.1)
    assert losses == losses_b
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_step_with_closure_returns_loss(cls):
    model = make_model()
    opt = make_opt(cls, model)
    x, y = next(batches(1))

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() > 0
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_dion3_is_nordion2():
    assert Dion3 is NorDion2
    assert set(dion_cpp.__all__) >= {"Muon", "NorMuon", "Dion2", "Dion3", "NorDion2", "Dion"}


def test_is_a_torch_optimizer_with_reference_group_keys():
    opt = make_opt(Muon, make_model())
    assert isinstance(opt, torch.optim.Optimizer)
    assert set(opt.param_groups[0]) == {"params", "lr", "mu", "beta1", "beta2", "weight_decay",
                                        "cautious_wd", "algorithm", "step", "epsilon", "nesterov",
                                        "flatten", "adjust_lr"}
    assert opt.param_groups[0]["algorithm"] == "muon" and opt.param_groups[1]["algorithm"] == "adamw"


# ---------------------------------------------------------------------------- state
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_state_is_the_live_cpp_state(cls):
    model, opt, _ = train(cls, steps=2)
    W = model[0].weight
    m = opt.state[W]["momentum"]
    x, y = next(batches(1, seed=5))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    before = m.clone()
    opt.step()
    assert opt.state[W]["momentum"] is m  # same tensor object, updated in place by C++
    assert not torch.equal(before, m)
    # Writing the Python tensor changes what C++ uses: zero momentum + zero grad = no update
    # for muon (weight decay aside, which lr=0 switches off).
    if cls is Muon:
        m.zero_()
        W.grad.zero_()
        opt.param_groups[0]["lr"] = 0.0
        w0 = W.detach().clone()
        opt.step()
        assert torch.equal(W, w0)


def test_state_keys_per_algorithm():
    model = make_model()
    opt = make_opt(NorMuon, model)
    W, b0, b1 = model[0].weight, model[0].bias, model[2].bias
    assert set(opt.state[W]) == {"momentum", "variance_neuron"}
    assert opt.state[W]["variance_neuron"].shape == (32, 1)
    assert set(opt.state[b0]) == {"momentum", "variance", "step_dev"}
    assert opt.state[b0]["step_dev"].dtype == torch.float32
    assert set(opt.state[b1]) == {"momentum"}
    dion_opt = make_opt(Dion, make_model(), rank_fraction=0.5)
    assert len(dion_opt.state) == 0  # legacy Dion creates state at the first step, as the reference
    dion_opt.init_state()
    assert dion_opt.state[dion_opt.param_groups[0]["params"][0]]["Q"].shape == (16, 8)


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_state_dict_round_trip_resumes_bitwise(cls):
    model, opt, _ = train(cls, steps=3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf)

    model2 = make_model(seed=99)
    model2.load_state_dict(model.state_dict())
    opt2 = make_opt(cls, model2)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["step"] == 3
    for p, p2 in zip(model.parameters(), model2.parameters()):
        for key, v in opt.state[p].items():
            assert torch.equal(opt2.state[p2][key], v) and opt2.state[p2][key].dtype == v.dtype

    for x, y in batches(3, seed=7):
        for m, o in ((model, opt), (model2, opt2)):
            o.zero_grad()
            torch.manual_seed(3)  # legacy Dion's sketches
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, p2)


def test_load_state_dict_keeps_state_dtypes_for_bf16_params():
    model = make_model().to(torch.bfloat16)
    opt = make_opt(Dion2, model)
    x, y = next(batches(1))
    torch.nn.functional.mse_loss(model(x.bfloat16()), y.bfloat16()).backward()
    opt.step()
    opt2 = make_opt(Dion2, model)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state[model[0].bias]["step_dev"].dtype == torch.float32  # not cast to bf16
    assert opt2.state[model[0].bias]["step_dev"].item() == 1.0


# ---------------------------------------------------------------------------- hyperparameters
def test_scheduler_drives_cpp_learning_rate():
    model = make_model()
    opt = make_opt(Muon, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step < 2 else 0.0)
    history = []
    for x, y in batches(4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        sched.step()
        history.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
    assert history == [True, True, False, False]  # lr 0: no update, no weight decay


def test_manual_group_edit_takes_effect():
    # Same run twice, the second with mu edited after step 1: the results must differ.
    _, _, a = train(Muon, steps=3)
    model = make_model()
    opt = make_opt(Muon, model)
    losses = []
    for x, y in batches(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.param_groups[0]["mu"] = 0.0
        losses.append(loss.item())
    assert losses[:2] == a[:2] and losses[2] != a[2]


def test_custom_orthogonalizer_is_called():
    calls = []

    def identity(X, epsilon=None):
        calls.append((tuple(X.shape), epsilon))
        return X

    W = torch.nn.Parameter(torch.zeros(8, 8))
    opt = Muon([W], lr=0.1, mu=0.0, weight_decay=0.0, newton_schulz_func=identity)
    W.grad = torch.full((8, 8), 0.5)
    opt.step()
    assert calls and calls[0][1] == pytest.approx(1e-8)
    # U = G (identity orthogonalizer, bf16 compute) and the square matrix's lr scale is 1.
    assert torch.allclose(W.detach(), torch.full((8, 8), -0.05), rtol=1e-3)


def test_add_param_group_after_construction():
    model = make_model()
    opt = Muon([model[0].weight], lr=0.02)
    opt.add_param_group({"params": [model[2].weight], "lr": 0.01})
    assert "momentum" in opt.state[model[2].weight]
    # lr: the reference's persistent 0-d float32 tensor (see test_scheduled.py)
    assert opt.param_groups[1]["lr"].item() == torch.tensor(0.01).item()
    assert opt.param_groups[1]["mu"] == 0.95


# ---------------------------------------------------------------------------- errors
def W(*shape):
    return torch.nn.Parameter(torch.randn(*shape))


@pytest.mark.parametrize("make,exc,words", [
    (lambda: Muon([W(4, 4)], lr=-1.0), ValueError, "lr"),
    (lambda: Muon([W(4, 4)], betas=(0.9,)), ValueError, "betas"),
    (lambda: Muon([W(4, 4)], adjust_lr="bogus"), ValueError, "adjust_lr"),
    (lambda: Muon([W(4, 4)], lr="fast"), TypeError, "lr"),
    (lambda: Muon([W(4, 4)], newton_schulz_func=3), TypeError, "callable"),
    (lambda: Muon([W(4)]), ValueError, "matrix"),
    (lambda: Muon([{"params": [W(4, 4)], "algorithm": "dion2"}]), ValueError, "param group 0"),
    (lambda: Muon([torch.zeros(4, 4, dtype=torch.long)]), TypeError, "floating point"),
    (lambda: Muon([{"params": [W(6, 4)], "num_heads": 4}]), ValueError, "num_heads"),
    (lambda: Muon([{"params": [W(6, 4)], "num_heads": 0}]), ValueError, "num_heads"),
    (lambda: Muon([{"params": [W(6, 4)], "split_sizes": [2, 2]}]), ValueError, "split_sizes"),
    (lambda: Dion2([W(4, 4)], fraction=0.0), ValueError, "fraction"),
    (lambda: Dion2([W(4, 4)], selection_scope="galaxy"), ValueError, "selection_scope"),
    (lambda: Dion2([{"params": [W(4, 4)], "split_sizes": [2, 2]}]), NotImplementedError, "split_sizes"),
    (lambda: NorDion2([W(4, 4)], mu=-0.5), ValueError, "mu"),
    (lambda: Dion([W(2, 4, 4)]), NotImplementedError, "2-D"),
    (lambda: Dion([W(4, 4)], rank_fraction=1.5), ValueError, "rank_fraction"),
    (lambda: Dion([W(4, 4)], qr_method="qr"), ValueError, "rcqr"),
])
def test_invalid_input_raises_reference_exception(make, exc, words):
    with pytest.raises(exc, match=words):
        make()


def test_invalid_edit_is_caught_at_step():
    p = W(6, 4)
    opt = Muon([p])
    p.grad = torch.randn(6, 4)
    opt.param_groups[0]["lr"] = -0.1
    with pytest.raises(ValueError, match="param group 0: invalid lr"):
        opt.step()
    opt.param_groups[0]["lr"] = 0.01
    opt.param_groups[0]["num_heads"] = 4
    with pytest.raises(ValueError, match="num_heads"):
        opt.step()


def test_mesh_type_is_checked():
    # Multi-rank meshes run in tests/python/test_distributed.py.
    class FakeMesh:
        def size(self):
            return 2

        def get_group(self):
            return None

    with pytest.raises(TypeError, match="DeviceMesh or ProcessGroup"):
        Muon([W(4, 4)], distributed_mesh=FakeMesh())
    with pytest.raises(TypeError, match="DeviceMesh or ProcessGroup"):
        Muon([W(4, 4)], distributed_mesh="mesh")


def test_load_state_dict_copies_instead_of_aliasing():
    model, opt, _ = train(Dion2, steps=2)
    opt2 = make_opt(Dion2, model)
    sd = opt.state_dict()
    opt2.load_state_dict(sd)
    W = model[0].weight
    assert opt2.state[W]["momentum"] is not opt.state[W]["momentum"]
    assert torch.equal(opt2.state[W]["momentum"], opt.state[W]["momentum"])


# ---------------------------------------------------------------------------- the hyperparameter table
def _other_values(default):
    """Candidate valid non-default values for a table field, by the default's Python type."""
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, float):
        return [v for v in (0.5, 0.75, 1.5, 2.0) if v != default]
    if isinstance(default, int):
        return [2, 3]
    if isinstance(default, str):
        return [v for v in ("global", "shard", "local", "shorter", "rms_norm", "none") if v != default]
    if isinstance(default, tuple):
        return [(0.5, 0.6)]
    if isinstance(default, list):
        return [[4, 4]]
    if default is None:
        return [torch.bfloat16]
    raise AssertionError(f"no candidate values for {default!r}")


def test_every_table_hyperparameter_is_a_group_key():
    """Every hyperparameter of the C++ table (dion/optim/hyperparameters.h) is a Python group key
    and keyword: set alone to another valid value it reaches the C++ group, and group_options
    lists every field."""
    table = [name for name, _doc in dion_cpp._C.hyperparameters()]
    assert "selection_dim" in table and "lr" in table
    opt = dion_cpp._C.Optimizer("any", {})
    for i, name in enumerate(table):
        p = torch.randn(8, 8)
        opt.add_param_group([p], {"params": [p]})
        before = opt.group_options(i)
        assert set(before) == set(table) | {"algorithm"}, name
        for value in _other_values(before[name]):
            try:
                opt.set_group(i, {name: value})
            except ValueError:
                continue  # outside the field's rule: try the next candidate
            break
        after = opt.group_options(i)
        assert after[name] != before[name], f"{name}: not carried from Python to C++"
        assert {k: v for k, v in after.items() if k != name} == \
            {k: v for k, v in before.items() if k != name}, f"{name}: changed another field"


def test_dion2_selection_dim_keyword():
    model = make_model()
    opt = make_opt(Dion2, model, selection_dim="shard")
    assert opt.param_groups[0]["selection_dim"] == "shard"
    assert opt._cpp.group_options(0)["selection_dim"] == "shard"
    with pytest.raises(ValueError, match="selection_dim"):
        make_opt(Dion2, make_model(), selection_dim="longer")

# ---------------------------------------------------------------------------- orthogonalizer paths
def test_gram_newton_schulz_and_fast_path():
    """use_gram_newton_schulz=True (the reference's flag) and the process-wide fast path run and
    stay within bf16 / fp16 rounding of the exact path after 3 steps (relative 2e-2 of the
    largest entry; tests/math/test_ortho_fast.cpp measures the orthogonalizers themselves)."""
    from dion_cpp import _C
    torch.manual_seed(0)
    w0 = [torch.randn(48, 160), torch.randn(64, 64)]
    g = [torch.randn_like(w) for w in w0]

    def run(**kw):
        ps = [torch.nn.Parameter(w.clone()) for w in w0]
        for p, gr in zip(ps, g):
            p.grad = gr.clone()
        opt = Muon(ps, lr=0.02, **kw)
        for _ in range(3):
            opt.step()
        return torch.cat([p.detach().flatten() for p in ps])

    exact = run()
    gram = run(use_gram_newton_schulz=True)
    assert _C.get_ortho_path() == "exact"
    try:
        _C.set_ortho_path("fast")
        fast = run()
    finally:
        _C.set_ortho_path("exact")
    with pytest.raises(ValueError, match="exact"):
        _C.set_ortho_path("quick")
    scale = exact.abs().max()
    for other in (gram, fast):
        assert not torch.equal(other, exact)
        assert (other - exact).abs().max() / scale < 2e-2


def test_cuda_kernels_are_opt_in():
    # The project's own CUDA kernels are off unless turned on (dion/math/own_kernels.h); on CPU
    # tensors the setting changes nothing: the same step bit for bit.
    from dion_cpp import _C
    torch.manual_seed(0)
    w0, g = torch.randn(32, 48), torch.randn(32, 48)

    def run():
        p = torch.nn.Parameter(w0.clone())
        p.grad = g.clone()
        Muon([p], lr=0.02).step()
        return p.detach()

    assert _C.get_cuda_kernels() is False
    off = run()
    try:
        _C.set_cuda_kernels(True)
        assert _C.get_cuda_kernels() is True
        on = run()
    finally:
        _C.set_cuda_kernels(False)
    assert _C.get_cuda_kernels() is False
    assert torch.equal(on, off) and not torch.equal(off, w0)


def test_cpu_compute_dtype_is_visible(monkeypatch):
    """What the fast path and Gram Newton-Schulz compute in on this CPU, and why: fp16 only
    where the CPU multiplies fp16 natively (ONEDNN_MAX_CPU_ISA below AVX512_CORE_FP16 rules it
    out), DION_FAST_CPU_DTYPE overrides (dion/math/ortho.h)."""
    from dion_cpp import _C
    monkeypatch.delenv("DION_FAST_CPU_DTYPE", raising=False)
    dtype, why = _C.cpu_compute_dtype("fp16")
    assert dtype in ("fp16", "fp32") and why.startswith(dtype + ": ")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert _C.cpu_compute_dtype("fp16")[0] == "fp32"
    assert _C.cpu_compute_dtype("bf16")[0] == "fp32"
    monkeypatch.setenv("DION_FAST_CPU_DTYPE", "bf16")
    assert _C.cpu_compute_dtype() == ("bf16", "bf16: DION_FAST_CPU_DTYPE=bf16")
    with pytest.raises(ValueError, match="fp32"):
        _C.cpu_compute_dtype("fp8")
