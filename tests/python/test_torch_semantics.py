"""dion_cpp as a torch.optim.Optimizer: what torch.optim users do between steps, single process.

What it checks (docs/optimizers.md, "Python module"; docs/errors.md):
  - a gradient whose shape, dtype or device is not its parameter's (set through p.grad.data,
    which bypasses torch's own check) is refused at step(), naming the parameter, nothing changed;
  - param_groups edited by hand after construction are followed at the next step as torch.optim
    follows them (an appended parameter is stepped, a replaced one is stepped instead of the old
    one, a deleted group is no longer stepped), each against a twin optimizer built over the
    edited groups from the start; add_param_group keeps working after such an edit;
  - a state dict missing a state key its algorithm needs (momentum, NorMuon's variance_neuron,
    legacy Dion's Q, AdamW's variance) beside the keys it has, or holding another algorithm's
    key, is refused by
    load_state_dict naming the parameter and the key, and the optimizer is unchanged: its next
    steps equal those of a twin that never saw the bad load;
  - range rules at construction and at step time (group["lr"] = inf as a scheduler would set it):
    lr must be finite and >= 0, epsilon finite and > 0, switches (nesterov, cautious_wd,
    flatten, use_polar_express) must be bools or 0 / 1, never strings.
"""
import math
import re

import pytest
import torch

import dion_cpp
from dion_cpp import Dion, Dion2, Muon, NorDion2, NorMuon

ALL = [Muon, NorMuon, Dion2, NorDion2, Dion]


def W(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape, generator=g))


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def clones(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def run(opt, params, steps, seed=100):
    for s in range(steps):
        set_grads(params, seed + s)
        torch.manual_seed(7)  # legacy Dion's sketches
        opt.step()


# ---------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_transposed_gradient_through_grad_data_is_refused(cls):
    p, q = W(8, 4), W(8, 4, seed=1)
    opt = cls([p, q], lr=0.1)
    before = [p.detach().clone(), q.detach().clone()]
    q.grad = torch.randn(8, 4)
    p.grad = torch.randn(8, 4)
    p.grad.data = torch.randn(4, 8)  # torch does not check this assignment
    with pytest.raises(RuntimeError, match=re.escape(
            "param group 0, parameter 0: the gradient (shape [4, 8], dtype torch.float32, device cpu) "
            "does not match the parameter (shape [8, 4], dtype torch.float32, device cpu)")):
        opt.step()
    assert torch.equal(p, before[0]) and torch.equal(q, before[1])  # nothing stepped


def test_gradient_of_another_dtype_is_refused_with_the_parameters_name():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.Linear(8, 2, bias=False))
    opt = Muon(model.named_parameters())
    w = model[1].weight
    w.grad = torch.zeros_like(w)
    w.grad.data = torch.zeros(w.shape, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"param group 0, parameter 1 '1\.weight': the gradient "
                                           r"\(shape \[2, 8\], dtype torch\.float64"):
        opt.step()


def test_matching_gradients_step_as_before():
    p = W(8, 4)
    opt = Muon([p])
    p.grad = torch.randn(8, 4)
    opt.step()  # no error: the check passes valid gradients
    assert opt.param_groups[0]["step"] == 1


# ---------------------------------------------------------------------------- param_groups edits
def tagged_step(opt, tagged, s):
    """One step; parameter p of (p, tag) gets the gradient of (tag, step s), whatever optimizer
    or group holds it, so an edited optimizer and its twins see the same gradients."""
    for p, tag in tagged:
        g = torch.Generator().manual_seed(1000 * tag + s)
        p.grad = torch.randn(p.shape, generator=g)
    torch.manual_seed(7 + s)  # legacy Dion's sketches and Q
    opt.step()


# Legacy Dion's randomized sketches draw from the global generator, so one parameter more or
# less in the optimizer changes the others' sketches (1e-5 as in test_distributed.py); the others
# are equal up to the megabatching of same-shape matrices.
TOL = 1e-5


def close(x, y):
    return torch.allclose(x, y, rtol=0, atol=TOL * max(1.0, y.abs().max().item()))


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_parameter_appended_to_a_group_is_stepped(cls):
    a, b = W(8, 4), W(8, 4, seed=1)
    a2, b2 = clones([a, b])
    opt = cls([a], lr=0.1)
    ref = cls([a2], lr=0.1)
    tagged_step(opt, [(a, 0)], 0)
    tagged_step(ref, [(a2, 0)], 0)
    opt.param_groups[0]["params"].append(b)
    ref.add_param_group({"params": [b2]})  # torch.optim: the same as appending by hand
    b0 = b.detach().clone()
    for s in (1, 2):
        tagged_step(opt, [(a, 0), (b, 1)], s)
        tagged_step(ref, [(a2, 0), (b2, 1)], s)
    assert not torch.equal(b, b0), "the appended parameter was not stepped"
    assert close(a, a2) and close(b, b2)
    assert b in opt.state and set(opt.state[b]) == set(ref.state[b2])


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_replaced_parameter_is_stepped_instead_of_the_old_one(cls):
    """The new parameter starts afresh, the others keep their state: `a` as if nothing had
    been edited, `new` as in an optimizer of its own built at the edit."""
    a, old, new = W(8, 4), W(8, 4, seed=1), W(8, 4, seed=2)
    a2, old2, new2 = clones([a, old, new])
    opt = cls([a, old], lr=0.1)
    unedited = cls([a2, old2], lr=0.1)
    tagged_step(opt, [(a, 0), (old, 1)], 0)
    tagged_step(unedited, [(a2, 0), (old2, 1)], 0)
    old_after = old.detach().clone()
    opt.param_groups[0]["params"][1] = new
    alone = cls([new2], lr=0.1)
    for s in (1, 2):
        tagged_step(opt, [(a, 0), (new, 2)], s)
        tagged_step(unedited, [(a2, 0), (old2, 1)], s)
        tagged_step(alone, [(new2, 2)], s)
    assert torch.equal(old, old_after), "the replaced parameter was still stepped"
    assert close(new, new2), "the new parameter was not stepped as a fresh one"
    assert close(a, a2), "the kept parameter lost its state"
    assert old not in opt.state and new in opt.state
    assert opt.param_groups[0]["step"] == 3


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_deleted_group_is_no_longer_stepped(cls):
    """The twin keeps the group but sets its lr to 0 at the edit (its parameter then stays put),
    so that both drew the same initial state (legacy Dion's Q) in the same order."""
    m, v, m2 = W(8, 4), W(8), W(16, 8, seed=3)
    m_, v2, m22 = clones([m, v, m2])

    def groups(a, b, c):
        return [{"params": [a]}, {"params": [b], "algorithm": "adamw"}, {"params": [c], "lr": 0.05}]
    opt, ref = cls(groups(m, v, m2), lr=0.1), cls(groups(m_, v2, m22), lr=0.1)
    tagged_step(opt, [(m, 0), (v, 1), (m2, 2)], 0)
    tagged_step(ref, [(m_, 0), (v2, 1), (m22, 2)], 0)
    del opt.param_groups[0]
    ref.param_groups[0]["lr"] = 0.0
    m_after = m.detach().clone()
    for s in (1, 2):
        tagged_step(opt, [(m, 0), (v, 1), (m2, 2)], s)  # m keeps getting gradients
        tagged_step(ref, [(m_, 0), (v2, 1), (m22, 2)], s)
    assert torch.equal(m, m_after), "a parameter of the deleted group was stepped"
    assert m not in opt.state
    assert close(v, v2) and close(m2, m22)
    assert [g["step"] for g in opt.param_groups] == [3, 3]
    # the group's own lr, after the re-indexing (a live 0-d tensor in the DistributedOrthoBase family)
    assert float(opt.param_groups[1]["lr"]) == pytest.approx(0.05)


def test_edits_then_add_param_group_and_state_dict_round_trip():
    a, b, c = W(8, 4), W(8, 4, seed=1), W(6, 4, seed=2)
    opt = NorMuon([a], lr=0.1)
    run(opt, [a], 1)
    opt.param_groups[0]["params"].append(b)
    opt.add_param_group({"params": [c], "lr": 0.02})
    run(opt, [a, b, c], 1)
    assert all(p in opt.state for p in (a, b, c))
    sd = opt.state_dict()
    assert len(sd["param_groups"]) == 2 and len(sd["state"]) == 3
    a2, b2, c2 = clones([a, b, c])
    fresh = NorMuon([{"params": [a2, b2]}, {"params": [c2], "lr": 0.02}], lr=0.1)
    fresh.load_state_dict(sd)
    run(opt, [a, b, c], 1, seed=50)
    run(fresh, [a2, b2, c2], 1, seed=50)
    assert all(torch.equal(x, y) for x, y in zip((a, b, c), (a2, b2, c2)))


def test_edited_group_with_a_repeated_or_non_tensor_parameter_is_refused():
    a, b = W(8, 4), W(8, 4, seed=1)
    opt = Muon([{"params": [a]}, {"params": [b]}])
    opt.param_groups[1]["params"].append(a)
    with pytest.raises(ValueError, match=r"param group 1, parameter 1: the same tensor is parameter 0 "
                                         r"of param group 0"):
        opt.step()
    opt.param_groups[1]["params"][1] = "w"
    with pytest.raises(TypeError, match=r"param group 1, parameter 1: optimizer can only optimize "
                                        r"Tensors, got str"):
        opt.step()


# ---------------------------------------------------------------------------- state dicts
def missing_cases():
    return [
        pytest.param(NorMuon, {}, "variance_neuron", id="NorMuon-variance_neuron"),
        pytest.param(NorMuon, {}, "momentum", id="NorMuon-momentum"),
        pytest.param(NorDion2, {}, "variance_neuron", id="NorDion2-variance_neuron"),
        pytest.param(NorDion2, {}, "momentum", id="NorDion2-momentum"),
        pytest.param(Dion, {}, "Q", id="Dion-Q"),
    ]


def trained(cls, seed=0, **kw):
    params = [W(8, 4, seed=seed), W(16, 8, seed=seed + 1)]
    opt = cls(params, lr=0.05, **kw)
    run(opt, params, 2)
    return opt, params


@pytest.mark.parametrize("cls,kw,key", missing_cases())
def test_state_dict_missing_a_needed_key_is_refused_and_changes_nothing(cls, kw, key):
    opt, params = trained(cls, **kw)
    twin_opt, twin_params = trained(cls, **kw)
    sd = opt.state_dict()
    del sd["state"][1][key]
    with pytest.raises(ValueError, match=re.escape(
            f"loading optimizer state: param group 0, parameter 1 of shape [16, 8]: state '{key}' missing")):
        opt.load_state_dict(sd)
    run(opt, params, 2, seed=400)  # still steps, as if the load had never been tried
    run(twin_opt, twin_params, 2, seed=400)
    assert all(torch.equal(p, q) for p, q in zip(params, twin_params))


def test_adamw_variance_missing_is_refused():
    m, v = W(8, 4), W(8)
    opt = Muon([{"params": [m]}, {"params": [v], "algorithm": "adamw"}])
    run(opt, [m, v], 1)
    sd = opt.state_dict()
    del sd["state"][1]["variance"]
    with pytest.raises(ValueError, match=r"param group 1, parameter 0 of shape \[8\]: state 'variance' "
                                         r"missing \(a adamw parameter's state is momentum, variance, step_dev"):
        opt.load_state_dict(sd)


def test_state_of_another_algorithm_is_refused():
    opt, params = trained(Muon)
    sd = opt.state_dict()
    sd["state"][0]["variance_neuron"] = torch.zeros(8, 1)
    with pytest.raises(ValueError, match=r"'variance_neuron' is not state of this group \(a muon "
                                         r"parameter's state is momentum"):
        opt.load_state_dict(sd)


def test_wrong_shape_still_names_the_key_and_both_shapes():
    opt, _ = trained(NorMuon)
    sd = opt.state_dict()
    sd["state"][0]["variance_neuron"] = torch.zeros(4, 1)
    with pytest.raises(ValueError, match=re.escape("'variance_neuron' has shape [4, 1], expected [8, 1]")):
        opt.load_state_dict(sd)


@pytest.mark.parametrize("entry", ["absent", "empty"])
def test_parameter_without_saved_state_starts_afresh(entry):
    """torch.optim: a parameter absent from sd["state"], or with an empty entry (Muon's only key
    deleted), has no state after the load and starts afresh."""
    opt, params = trained(NorMuon)
    sd = opt.state_dict()
    if entry == "absent":
        del sd["state"][1]
    else:
        sd["state"][1] = {}
    loaded_params = clones(params)
    loaded = NorMuon(loaded_params, lr=0.05)
    loaded.load_state_dict(sd)
    new = clones(params[1:])
    brand_new = NorMuon(new, lr=0.05)
    tagged_step(loaded, [(loaded_params[0], 0), (loaded_params[1], 1)], 0)
    tagged_step(brand_new, [(new[0], 1)], 0)
    assert torch.equal(loaded.state[loaded_params[1]]["momentum"], brand_new.state[new[0]]["momentum"])
    assert torch.equal(loaded.state[loaded_params[1]]["variance_neuron"],
                       brand_new.state[new[0]]["variance_neuron"])
    assert not torch.equal(loaded.state[loaded_params[0]]["momentum"],
                           NorMuon(clones(params[:1])).state_dict()["state"][0]["momentum"])


# ---------------------------------------------------------------------------- ranges
@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
@pytest.mark.parametrize("key,value,words", [
    ("lr", math.inf, "lr = inf (must be finite and >= 0)"),
    ("lr", -0.1, "lr = -0.1 (must be finite and >= 0)"),
    ("epsilon", 0.0, "epsilon = 0 (must be finite and > 0)"),
    ("epsilon", -1e-8, "epsilon = -1e-08 (must be finite and > 0)"),
])
def test_lr_and_epsilon_set_on_a_group_at_step_time_are_refused(cls, key, value, words):
    """As a scheduler sets group["lr"]: refused at the next step, the weights untouched."""
    p = W(8, 4)
    opt = cls([p], lr=0.1)
    run(opt, [p], 1)
    before = p.detach().clone()
    opt.param_groups[0][key] = value
    set_grads([p], 9)
    with pytest.raises(ValueError, match=re.escape(f"param group 0: invalid {words}")):
        opt.step()
    assert torch.equal(p, before)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_lr_inf_and_epsilon_zero_are_refused_at_construction(cls):
    with pytest.raises(ValueError, match=re.escape("param group 0: invalid lr = inf (must be finite and >= 0)")):
        cls([W(8, 4)], lr=math.inf)
    with pytest.raises(ValueError, match=re.escape("param group 0: invalid epsilon = 0 (must be finite and > 0)")):
        cls([W(8, 4)], epsilon=0.0)


def test_zero_gradient_with_the_smallest_epsilon_stays_finite():
    """What epsilon > 0 buys: a zero gradient (0 / (0 + eps)) gives a zero update, not NaN."""
    m, v = W(8, 4), W(8)
    opt = Muon([{"params": [m]}, {"params": [v], "algorithm": "adamw"}], epsilon=1e-30)
    m.grad, v.grad = torch.zeros(8, 4), torch.zeros(8)
    opt.step()
    assert torch.isfinite(m).all() and torch.isfinite(v).all()


@pytest.mark.parametrize("key", ["nesterov", "cautious_wd"])
@pytest.mark.parametrize("value", ["no", "False", None, 2])
def test_switches_must_be_bools(key, value):
    with pytest.raises(TypeError, match=re.escape(
            f"param group 0: option '{key}' must be a bool (True or False, or the integers 0 / 1), got {value!r}")):
        Muon([W(8, 4)], **{key: value})
    opt = Muon([W(8, 4)])
    opt.param_groups[0][key] = value
    with pytest.raises(TypeError, match=f"option '{key}' must be a bool"):
        opt.step()


def test_ortho_switch_must_be_a_bool():
    with pytest.raises(TypeError, match=re.escape("option 'use_polar_express' must be a bool")):
        Muon([W(8, 4)], use_polar_express="no")


@pytest.mark.parametrize("value", [True, False, 0, 1])
def test_bools_and_0_1_are_switches(value):
    import numpy as np
    a, b = W(8, 4), W(8, 4)
    opt = Muon([a], nesterov=value)
    ref = Muon([b], nesterov=bool(value))
    npopt = Muon([W(8, 4)], nesterov=np.bool_(bool(value)))
    assert npopt._cpp.group_options(0)["nesterov"] is bool(value)
    run(opt, [a], 2)
    run(ref, [b], 2)
    assert torch.equal(a, b)


@pytest.mark.parametrize("cls", [Muon, Dion], ids=lambda c: c.__name__)
def test_scheduler_that_makes_lr_inf_is_refused_at_the_next_step(cls):
    """A LambdaLR whose factor overflows writes group["lr"] (a float32 tensor for Muon, a float
    for Dion): the next step refuses it, the weights untouched."""
    p = W(8, 4)
    opt = cls([p], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s == 0 else math.inf)
    run(opt, [p], 1)
    sched.step()
    before = p.detach().clone()
    set_grads([p], 9)
    with pytest.raises(ValueError, match=re.escape("param group 0: invalid lr = inf (must be finite and >= 0)")):
        opt.step()
    assert torch.equal(p, before)
