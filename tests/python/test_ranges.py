"""The reference's ranges: every constructor argument and param-group key of every class, with the
values microsoft/dion accepts and refuses, against dion_cpp.

The table is data, tests/vectors/reference_ranges.json: for each option and class the reference's
rule with the line that decides it (file:line at the commit named there), dion_cpp's rule, and
sample values at the boundaries (0, 1, negative, just above 1, NaN, inf), sorted into
  accepted  both accept them: dion_cpp constructs, steps once and keeps the weights finite;
  refused   both refuse them: dion_cpp when the optimizer is built (the reference at construction
            or, for group keys, at its first step);
  extra     the reference accepts them, dion_cpp refuses them because they cannot work
            (docs/errors.md has a row for each such option).
A constructor option is checked a second time as a param-group key (dion_cpp checks a group by
the constructor's rules; the reference checks no group, docs/errors.md). tests/optim/test_ranges.cpp
runs the same rows through the C++ Options.

This file runs from the repository alone; test_live_ranges.py checks the table's reference column
against the reference itself (ctest python_live_reference, with -DDION_REFERENCE_DIR). The meaning of the values the reference added to our ranges (mu and
ef_decay of 1 and above, negative weight decay, ...) is pinned at the end.
"""
import json
import math
import os
import re

import pytest
import torch

import dion_cpp

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
with open(os.path.join(ROOT, "tests", "vectors", "reference_ranges.json")) as f:
    TABLE = json.load(f)
SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
REFUSAL = (ValueError, TypeError, NotImplementedError)


def decode(v):
    if isinstance(v, str):
        return SPECIAL.get(v, v)
    if isinstance(v, list):
        return [decode(x) for x in v]
    if isinstance(v, dict):
        return {k: decode(x) for k, x in v.items()}
    return v


def classes(row):
    """The row's classes, Dion3 beside NorDion2 (the same class in both libraries)."""
    out = dict(row["classes"])
    if "NorDion2" in out:
        out["Dion3"] = out["NorDion2"]
    return out


def cases(where):
    """(row, class, outcome, value) for every sample value; `where`: "ctor" (the option as given,
    a keyword or a group key) or "group" (a constructor option again, as a group key)."""
    out = []
    for i, row in enumerate(TABLE["rows"]):
        if where == "group" and (row.get("group") or not row.get("group_key")):
            continue
        for cls in classes(row):
            for outcome in ("accepted", "refused", "extra"):
                for value in row[outcome]:
                    value = decode(value)
                    if where == "group" and isinstance(row["group_key"], list) and len(value) != 2:
                        continue  # a pair's length is a keyword check only
                    label = f"{row['option']}-{cls}-{outcome}-{value!r}"
                    if row.get("group_algorithm"):
                        label += "-in-" + row["group_algorithm"]
                    out.append(pytest.param(row, cls, outcome, value, id=f"{i}:{label}"))
    return out


def build(module, cls, row, value, where):
    """The optimizer `cls` of `module` with `value` set as the row says: a keyword, a key of the
    matrix group, or a key of a second group of row["group_algorithm"] (a vector parameter)."""
    torch.manual_seed(0)
    W = torch.nn.Parameter(torch.randn(8, 4))
    b = torch.nn.Parameter(torch.randn(8))
    groups = [{"params": [W]}]
    target = groups[0]
    if row.get("group_algorithm"):
        groups.append({"params": [b], "algorithm": row["group_algorithm"]})
        target = groups[1]
    kwargs = {}
    if row.get("group"):
        target.update(value if row["option"] is None else {row["option"]: value})
    elif where == "ctor":
        kwargs[row["option"]] = value
    elif isinstance(row["group_key"], list):
        target.update(dict(zip(row["group_key"], value)))
    else:
        target[row["group_key"]] = value
    opt = getattr(module, cls)(groups, **kwargs)
    return opt, [p for g in groups for p in g["params"]]


def step(opt, params):
    torch.manual_seed(1)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()


def check_ours(row, cls, outcome, value, where):
    if outcome == "accepted":
        opt, params = build(dion_cpp, cls, row, value, where)
        step(opt, params)
        assert all(torch.isfinite(p).all() for p in params), "an accepted value gave non-finite weights"
    else:  # refused or extra: refused when the optimizer is built
        with pytest.raises(REFUSAL):
            build(dion_cpp, cls, row, value, where)


@pytest.mark.parametrize("row,cls,outcome,value", cases("ctor"))
def test_ours(row, cls, outcome, value):
    check_ours(row, cls, outcome, value, "ctor")


@pytest.mark.parametrize("row,cls,outcome,value", cases("group"))
def test_ours_as_a_group_key(row, cls, outcome, value):
    check_ours(row, cls, outcome, value, "group")


def test_the_table_covers_every_class_and_cites_the_reference():
    seen = set()
    for row in TABLE["rows"]:
        assert row["reference"] and row["ours"], row
        assert set(row) >= {"classes", "accepted", "refused", "extra"}, row
        for cls, cite in row["classes"].items():
            assert hasattr(dion_cpp, cls), cls
            assert re.fullmatch(r"dion/\w+\.py:\d+", cite), cite
            seen.add(cls)
    assert seen == {"Muon", "NorMuon", "Dion2", "NorDion2", "Dion"}
    assert dion_cpp.Dion3 is dion_cpp.NorDion2


def test_every_extra_refusal_has_a_row_in_errors_md():
    with open(os.path.join(ROOT, "docs", "errors.md")) as f:
        errors = f.read()
    for row in TABLE["rows"]:
        if row["extra"]:
            named = re.search(r"`[^`\n]*\b" + re.escape(row["option"]) + r"\b[^`\n]*`", errors)
            assert named, f"docs/errors.md: no row names `{row['option']}`"


# ---------------------------------------------------------------------------- what the values mean
def W(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape))


def grads(params, seed):
    torch.manual_seed(seed)
    out = [torch.randn_like(p) for p in params]
    for p, g in zip(params, out):
        p.grad = g.clone()
    return out


def test_dion2_ef_decay_of_1_keeps_the_selected_slices():
    """ef_decay = 1: the selected slices keep their momentum (M += G, no decay anywhere), and
    the update is the one of any other ef_decay (the selection is taken before the decay)."""
    p, q = W(8, 16), W(8, 16)
    one = dion_cpp.Dion2([p], ef_decay=1.0, fraction=0.5)
    other = dion_cpp.Dion2([q], ef_decay=0.5, fraction=0.5)
    (g1,) = grads([p], 3)
    grads([q], 3)  # the same gradient
    one.step()
    other.step()
    assert torch.equal(one.state[p]["momentum"], g1)
    assert torch.equal(p, q)
    m = other.state[q]["momentum"]
    assert int((m != g1).any(dim=1).sum()) == 4  # ef_decay 0.5 halves the 4 selected rows
    (g2,) = grads([p], 4)
    one.step()
    assert torch.allclose(one.state[p]["momentum"], g1 + g2, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mu", [1.0, 1.5])
def test_muon_mu_of_1_and_above_scales_the_momentum(mu):
    p = W(8, 4)
    opt = dion_cpp.Muon([p], mu=mu)
    (g1,) = grads([p], 3)
    opt.step()
    (g2,) = grads([p], 4)
    opt.step()
    assert torch.allclose(opt.state[p]["momentum"], mu * g1 + g2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", [dion_cpp.Muon, dion_cpp.NorMuon, dion_cpp.Dion2, dion_cpp.NorDion2])
def test_negative_weight_decay_grows_the_weights(cls):
    """The reference does not check weight_decay outside Dion: X *= 1 - lr * wd (a zero gradient
    gives a zero update)."""
    p = W(8, 4)
    x0 = p.detach().clone()
    opt = cls([p], lr=0.1, weight_decay=-0.5)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.allclose(p, x0 * (1 + 0.1 * 0.5), rtol=1e-6, atol=0)


def test_normuon_muon_beta2_of_1_keeps_the_variance():
    p = W(8, 4)
    opt = dion_cpp.NorMuon([p], muon_beta2=1.0)
    grads([p], 3)
    opt.step()
    assert torch.equal(opt.state[p]["variance_neuron"], torch.zeros(8, 1))
    assert torch.isfinite(p).all()


def test_lion_beta2_of_1_keeps_the_momentum():
    M, b = W(8, 4), W(8)
    opt = dion_cpp.Muon([{"params": [M]}, {"params": [b], "algorithm": "lion", "beta1": 0.9, "beta2": 1.0}])
    grads([M, b], 3)
    opt.step()
    assert torch.equal(opt.state[b]["momentum"], torch.zeros(8))
