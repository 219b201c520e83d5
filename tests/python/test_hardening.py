"""dion_cpp against bad or unusual input: all-or-nothing load_state_dict, state of the wrong
dtype, algorithm edits between steps, copies, hyperparameter ranges, empty parameters, a user
orthogonalizer of the wrong shape; and the drop-in extras (lm_head_lr_scale, __version__,
Dion2's verbose). docs/optimizers.md ("Python module") lists each behaviour."""
import copy
import io
import os
import pickle
import re

import pytest
import torch

import dion_cpp
from dion_cpp import Dion, Dion2, Muon, NorDion2, NorMuon
from test_optimizers import batches, make_model, make_opt, train

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def one_step(model, opt, seed=11):
    x, y = next(batches(1, seed=seed))
    opt.zero_grad()
    torch.manual_seed(3)  # legacy Dion's sketches
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def snapshot(opt):
    """Every group value and state tensor (cloned), plus the state tensors' identities."""
    groups = [{k: (v.clone() if isinstance(v, torch.Tensor) else copy.copy(v))
               for k, v in g.items() if k != "params"} for g in opt.param_groups]
    params = [p for g in opt.param_groups for p in g["params"]]
    state = [{k: v.clone() for k, v in opt.state[p].items()} if p in opt.state else None for p in params]
    ids = [{k: id(v) for k, v in opt.state[p].items()} if p in opt.state else None for p in params]
    return groups, state, ids


def assert_same_snapshot(a, b):
    (ga, sa, ia), (gb, sb, ib) = a, b
    assert len(ga) == len(gb)
    for x, y in zip(ga, gb):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k
    assert ia == ib
    for x, y in zip(sa, sb):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


# ---------------------------------------------------------------------------- load: all or nothing
def dion_state_dict():
    _, opt, _ = train(Dion, steps=2)
    return opt.state_dict()


def momentum_replaced(value_of):
    def edit(sd):
        st = sd["state"][0]
        st["momentum"] = value_of(st["momentum"])
        return sd
    return edit


REFUSED = [
    ("dion state dict into muon", lambda sd: dion_state_dict(), ValueError,
     r"loading optimizer state: param group 0 \(dion\): this optimizer runs 'muon'"),
    ("momentum of another shape", momentum_replaced(lambda m: torch.zeros(3, 3)), ValueError,
     r"param group 0, parameter 0 of shape \[32, 16\]: 'momentum' has shape \[3, 3\], expected \[32, 16\]"),
    ("int64 momentum", momentum_replaced(lambda m: m.long()), TypeError,
     r"'momentum' has dtype torch.int64; optimizer state must be floating point"),
    ("unknown state key", lambda sd: (sd["state"][0].update(bogus=torch.zeros(1)), sd)[1], ValueError,
     r"'bogus': unknown state key"),
    ("one group too many", lambda sd: (sd["param_groups"].append(dict(sd["param_groups"][-1], params=[99])), sd)[1],
     ValueError, "4 param groups, this optimizer 3"),
    ("invalid group value", lambda sd: (sd["param_groups"][0].update(mu=-1.5), sd)[1], ValueError,
     r"loading optimizer state: param group 0: invalid mu"),
]


@pytest.mark.parametrize("name,edit,exc,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_load_leaves_the_optimizer_as_it_was(name, edit, exc, words):
    model, opt, _ = train(Muon, steps=2)
    twin_model, twin_opt, _ = train(Muon, steps=2)
    sd = edit(copy.deepcopy(twin_opt.state_dict()))
    before = snapshot(opt)
    with pytest.raises(exc, match=words):
        opt.load_state_dict(sd)
    assert_unchanged(opt, before, model, twin_model, twin_opt)


def assert_unchanged(opt, before, model, twin_model, twin_opt):
    """opt's groups and state as `before`, and its next step equal to an untouched twin's."""
    assert_same_snapshot(snapshot(opt), before)
    one_step(model, opt)
    one_step(twin_model, twin_opt)
    for p, q in zip(model.parameters(), twin_model.parameters()):
        assert torch.equal(p, q)


def test_failure_while_loading_is_rolled_back():
    """A failure after the checks (here: injected into the load itself) restores everything."""
    model, opt, _ = train(Dion2, steps=2)
    twin_model, twin_opt, _ = train(Dion2, steps=2)
    _, other, _ = train(Dion2, steps=4, lr=0.05)
    sd = other.state_dict()
    before = snapshot(opt)

    def boom():
        raise RuntimeError("injected")

    opt._sync_hyperparam_tensors = boom
    with pytest.raises(RuntimeError, match="injected"):
        opt.load_state_dict(sd)
    del opt._sync_hyperparam_tensors
    assert_unchanged(opt, before, model, twin_model, twin_opt)


def test_fp16_state_is_cast_to_the_parameter_dtype():
    model, opt, _ = train(Muon, steps=2)
    sd = copy.deepcopy(opt.state_dict())
    half = sd["state"][0]["momentum"].half()
    sd["state"][0]["momentum"] = half
    opt2 = make_opt(Muon, model)
    opt2.load_state_dict(sd)
    W = model[0].weight
    m = opt2.state[W]["momentum"]
    assert m.dtype == torch.float32 and torch.equal(m, half.float())
    one_step(model, opt2)  # and it is what C++ steps with
    assert opt2.state[W]["momentum"] is m and not torch.equal(m, half.float())


def test_load_replaces_all_state():
    """Parameters the checkpoint has no state for start afresh (torch.optim's semantics)."""
    model, opt, _ = train(Dion, steps=2)
    fresh = make_opt(Dion, make_model())
    opt.load_state_dict(fresh.state_dict())  # legacy Dion: no state before the first step
    assert len(opt.state) == 0
    one_step(model, opt)
    assert all(p in opt.state for p in model.parameters())


# ---------------------------------------------------------------------------- group edits
def test_algorithm_edit_between_steps_restarts_that_groups_state():
    model, opt, _ = train(Muon, steps=2)
    W = model[0].weight
    opt.param_groups[0]["algorithm"] = "adamw"
    w0 = W.detach().clone()
    one_step(model, opt)
    assert set(opt.state[W]) == {"momentum", "variance", "step_dev"}
    assert opt.state[W]["step_dev"].item() == 1.0  # AdamW's own count starts at this step
    assert not torch.equal(W, w0)
    opt.param_groups[0]["algorithm"] = "muon"
    one_step(model, opt)
    assert set(opt.state[W]) == {"momentum"}


def test_invalid_algorithm_edit_is_refused_and_changes_nothing():
    model, opt, _ = train(Muon, steps=2)
    opt.param_groups[1]["algorithm"] = "muon"  # a bias vector
    with pytest.raises(ValueError, match=r"param group 1 \(muon\), parameter 0 of shape \[32\]: 'muon' needs matrix"):
        one_step(model, opt)
    opt.param_groups[1]["algorithm"] = "adamw"
    one_step(model, opt)
    twin_model, twin_opt, _ = train(Muon, steps=2)
    one_step(twin_model, twin_opt)
    for p, q in zip(model.parameters(), twin_model.parameters()):
        assert torch.equal(p, q)


def test_layout_edit_is_checked_directly():
    p = torch.nn.Parameter(torch.randn(6, 4))
    opt = Muon([p])
    p.grad = torch.randn(6, 4)
    opt.param_groups[0]["split_sizes"] = [2, 3]
    with pytest.raises(ValueError, match=r"split_sizes sum to 5 but must sum to dim 0 \(6\)"):
        opt.step()
    opt.param_groups[0]["split_sizes"] = [2, 4]
    opt.step()


# ---------------------------------------------------------------------------- copies
@pytest.mark.parametrize("how", ["deepcopy", "copy", "pickle", "torch.save"])
def test_copies_are_refused_at_copy_time(how):
    _, opt, _ = train(NorMuon, steps=1)
    do = {"deepcopy": copy.deepcopy, "copy": copy.copy, "pickle": pickle.dumps,
          "torch.save": lambda o: torch.save(o, io.BytesIO())}[how]
    with pytest.raises(TypeError, match=r"cannot be copied or pickled .*state_dict\(\)"):
        do(opt)


# ---------------------------------------------------------------------------- ranges
def W(*shape):
    return torch.nn.Parameter(torch.randn(*shape))


@pytest.mark.parametrize("make,words", [
    (lambda: Muon([W(4, 4)], mu=-0.5), "mu = -0.5 (must be finite and >= 0)"),
    (lambda: Muon([W(4, 4)], mu=float("nan")), "mu = nan (must be finite and >= 0)"),
    (lambda: Muon([W(4, 4)], betas=(-0.1, 0.9)), "betas = (-0.1, 0.9) (each must be finite and >= 0"),
    (lambda: NorMuon([W(4, 4)], muon_beta2=1.5), "muon_beta2 = 1.5 (must be in [0, 1])"),
    (lambda: Dion2([W(4, 4)], ef_decay=-0.2), "ef_decay = -0.2 (must be finite and >= 0)"),
    (lambda: Muon([W(4, 4)], lr=float("nan")), "lr = nan"),
    (lambda: Muon([W(4, 4)], epsilon=float("inf")), "epsilon = inf (must be finite and > 0)"),
    (lambda: Muon([W(4, 4)], epsilon=0.0), "epsilon = 0 (must be finite and > 0)"),
    (lambda: Dion([W(4, 4)], weight_decay=-0.1), "weight_decay = -0.1 (must be finite, and >= 0 for dion)"),
    (lambda: Dion2([W(4, 4)], fraction=1.5), "fraction = 1.5 (must be in (0, 1])"),
    (lambda: Dion([W(4, 4)], rank_fraction=0.0), "rank_fraction = 0 (must be in (0, 1])"),
    (lambda: Dion([W(4, 4)], rcqr_oversample=0.0), "oversample = 0 (must be finite and > 0)"),
    (lambda: Muon([{"params": [W(4, 4)]}, {"params": [W(4)], "algorithm": "adamw", "beta2": 1.0}]),
     "param group 1: invalid betas = (0.9, 1) (each must be finite and >= 0; for adamw beta1 != 1 and beta2 < 1)"),
])
def test_ranges_are_the_references(make, words):
    """The reference's ranges (tests/python/test_ranges.py walks all of them), plus the values
    that cannot work (docs/errors.md)."""
    with pytest.raises(ValueError, match=re.escape(words if words.startswith("param group") else
                                                   "param group 0: invalid " + words)):
        make()


def test_out_of_range_edit_is_refused_at_step():
    model, opt, _ = train(Muon, steps=1)
    opt.param_groups[0]["mu"] = -1.5
    with pytest.raises(ValueError, match=re.escape("param group 0: invalid mu = -1.5 (must be finite and >= 0)")):
        one_step(model, opt)


# ---------------------------------------------------------------------------- empty parameters
@pytest.mark.parametrize("cls", [Muon, NorMuon, Dion2, NorDion2, Dion], ids=lambda c: c.__name__)
@pytest.mark.parametrize("shape", [(16, 0), (0, 16)])
def test_empty_parameter_is_a_no_op(cls, shape):
    E, M = W(*shape), W(8, 16)
    opt = cls([E, M], lr=0.1)
    E.grad, M.grad = torch.zeros(shape), torch.randn(8, 16)
    m0 = M.detach().clone()
    opt.step()
    opt.step()
    assert E.shape == shape and not torch.equal(M, m0)
    if cls is Dion:
        opt.init_state()  # legacy Dion creates state at a step only for what it updates
    assert opt.state[E]["momentum"].shape == shape
    sd = opt.state_dict()
    cls([W(*shape), W(8, 16)], lr=0.1).load_state_dict(sd)


# ---------------------------------------------------------------------------- orthogonalizer
def test_newton_schulz_func_of_the_wrong_shape_is_an_error():
    p = W(8, 16)
    opt = Muon([p], newton_schulz_func=lambda X, epsilon=None: X[..., :4])
    p.grad = torch.randn(8, 16)
    with pytest.raises(ValueError, match=r"newton_schulz_func returned a tensor of shape \[1, 8, 4\] for an "
                                         r"input of shape \[1, 8, 16\]"):
        opt.step()
    opt2 = Muon([W(8, 16)], newton_schulz_func=lambda X, epsilon=None: "not a tensor")
    opt2.param_groups[0]["params"][0].grad = torch.randn(8, 16)
    with pytest.raises(TypeError, match="newton_schulz_func must return a torch.Tensor, got str"):
        opt2.step()


# ---------------------------------------------------------------------------- drop-in extras
def test_lm_head_lr_scale_as_the_reference():
    from dion_cpp.opt_utils import lm_head_lr_scale  # the reference's train.py import, renamed
    assert lm_head_lr_scale("lion", 1024) == 1 / 32
    assert lm_head_lr_scale("adamw", 1024) == 1.0
    assert dion_cpp.lm_head_lr_scale is lm_head_lr_scale


def test_version_is_the_project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        version = re.search(r"project\(dion-cpp VERSION ([0-9.]+)", f.read()).group(1)
    assert dion_cpp.__version__ == version
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert f'version = "{version}"' in f.read()


def test_dion2_verbose_prints_each_selection_once(capsys):
    p, q = W(8, 16), W(24, 8)
    opt = Dion2([p, q], verbose=True)
    for _ in range(2):
        p.grad, q.grad = torch.randn(8, 16), torch.randn(24, 8)
        opt.step()
    out = capsys.readouterr().out
    assert out.count("[Dion2] Shape (8, 16): DDP/Single-GPU, shorter dim = rows (8) \u2192 "
                     "select top-\u03b1 rows by row norms") == 1
    assert out.count("[Dion2] Shape (24, 8): DDP/Single-GPU, shorter dim = cols (8) \u2192 "
                     "select top-\u03b1 columns by col norms") == 1
    Dion2([W(8, 16)]).step()
    assert capsys.readouterr().out == ""  # quiet by default


def test_q_of_the_wrong_rank_is_refused_before_legacy_dions_first_step():
    _, opt, _ = train(Dion, steps=1)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["Q"] = sd["state"][0]["Q"].flatten()
    fresh = make_opt(Dion, make_model())  # no state yet: Q's shape [n, r] from the checkpoint's group
    with pytest.raises(ValueError, match=r"'Q' has shape \[256\], expected \[16, 16\]"):
        fresh.load_state_dict(sd)
    assert len(fresh.state) == 0
    sd["state"][0]["Q"] = torch.zeros(16, 8)  # a matrix of another rank r than the group's
    with pytest.raises(ValueError, match=r"'Q' has shape \[16, 8\], expected \[16, 16\]"):
        fresh.load_state_dict(sd)
    assert len(fresh.state) == 0


# ---------------------------------------------------------------------------- late or unclear errors
# Each of these used to fail late or with a message naming neither the parameter nor what would
# be valid (a fresh adversarial pass); each now names the thing, at the earliest point.
def test_a_parameter_resized_after_construction_is_named_at_step():
    p = torch.nn.Parameter(torch.randn(8, 16))
    opt = Muon([p], lr=0.01)
    p.grad = torch.randn(8, 16)
    opt.step()
    p.data = torch.randn(12, 16)  # was: "The size of tensor a (8) must match the size of tensor b (12)"
    p.grad = torch.randn(12, 16)
    with pytest.raises(ValueError, match=r"param group 0, parameter 0: its shape is \[12, 16\] but was \[8, 16\]"):
        opt.step()


def test_a_parameter_on_the_meta_device_is_refused_at_construction():
    p = torch.nn.Parameter(torch.empty(8, 16, device="meta"))
    with pytest.raises(ValueError, match=r"parameter 0 of shape \[8, 16\]: is on the meta device.*to_empty"):
        Muon([p], lr=0.01)


def test_a_meta_parameter_in_a_group_on_the_cpu_is_refused_at_construction():
    # The meta check names the parameter first. A group mixing cpu and cuda parameters (the
    # other refusal, src/optim/optimizer.cpp) needs a second real device: not tested on a CPU.
    p, q = torch.nn.Parameter(torch.randn(8, 16)), torch.nn.Parameter(torch.empty(8, 16, device="meta"))
    with pytest.raises(ValueError, match=r"param group 0 \(dion2\), parameter 1 of shape \[8, 16\]: is on the "
                                         r"meta device \(it has no data\): materialize the model"):
        Dion2([{"params": [p, q]}], lr=0.01)


def test_an_unrelated_state_dict_names_the_missing_key():
    p = torch.nn.Parameter(torch.randn(8, 16))
    opt = Muon([p], lr=0.01)
    before = snapshot(opt)
    with pytest.raises(ValueError, match=r"param group 0 of the state dict has no 'lr'.*not a state_dict\(\) of a "
                                         r"Muon"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": [0]}]})
    assert_same_snapshot(snapshot(opt), before)


def test_an_integer_state_dtype_is_refused_at_construction():
    from dataclasses import dataclass

    @dataclass
    class MixedPrecision:
        momentum_dtype: torch.dtype = torch.int32

    p = torch.nn.Parameter(torch.randn(8, 16))
    with pytest.raises(ValueError, match=r"momentum_dtype.*must be a floating dtype"):
        Dion([p], lr=0.01, mixed_precision_config=MixedPrecision())
