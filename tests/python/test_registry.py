"""The algorithm registry from Python: the builtin classes are generated from it (signatures
and defaults are the reference's), and a plugin's algorithm (tests/optim/sign_descent.cpp, built
as dion_sign_descent) becomes a class by dion_cpp.load_algorithm_plugin with no Python file
knowing it."""
import inspect
import os
import pathlib

import pytest
import torch

import dion_cpp
from dion_cpp import _C


def _plugin():
    build = pathlib.Path(_C.__file__).resolve().parents[2]  # build/python/dion_cpp/_C*.so
    path = build / "tests" / "libdion_sign_descent.so"
    if not path.exists():
        pytest.skip(f"the test plugin is not built ({path})")
    return path


def test_builtin_classes_come_from_the_registry():
    assert list(dion_cpp.classes())[:6] == ["Muon", "NorMuon", "Dion2", "NorDion2", "Dion3", "Dion"]
    assert dion_cpp.Dion3 is dion_cpp.NorDion2
    # Every built-in matrix algorithm has its entry in the class table, and only those do.
    from dion_cpp._class_table import CLASSES
    builtin = [a["name"] for a in _C.algorithms() if a["matrix"] and a["name"] != "sign_descent"]
    assert sorted(builtin) == sorted(CLASSES)
    assert [dion_cpp.classes()[CLASSES[n].name].algorithm for n in builtin] == builtin
    sig = inspect.signature(dion_cpp.Muon)
    assert list(sig.parameters)[:4] == ["params", "distributed_mesh", "lr", "mu"]
    assert sig.parameters["use_polar_express"].default is True
    assert inspect.signature(dion_cpp.Dion).parameters["rcqr_oversample"].default == 1.25
    with pytest.raises(TypeError):
        dion_cpp.Muon([torch.zeros(2, 2, requires_grad=True)], bogus=1)
    with pytest.raises(ValueError, match=r"Dion supports power_iters=1 only, got 2"):
        dion_cpp.Dion([torch.zeros(2, 2, requires_grad=True)], power_iters=2)


def test_plugin_algorithm_is_a_class():
    added = dion_cpp.load_algorithm_plugin(_plugin())
    assert "SignDescent" in added and dion_cpp.SignDescent is added["SignDescent"]
    # No entry in the class table: the default class (distributed_mesh, lr, mu, weight_decay).
    assert list(inspect.signature(dion_cpp.SignDescent).parameters) == ["params", "distributed_mesh", "lr", "mu",
                                                                        "weight_decay"]
    assert dion_cpp.load_algorithm_plugin(_plugin()) == {}  # loaded once
    torch.manual_seed(0)
    W = torch.randn(6, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    W0 = W.detach().clone()
    opt = dion_cpp.SignDescent([{"params": [W]}, {"params": [b], "algorithm": "adamw"}], lr=0.1, mu=0.5,
                               weight_decay=0.2)
    M = torch.zeros_like(W0)
    expected = W0.clone()
    for _ in range(3):
        G = torch.randn(6, 4)
        W.grad = G.clone()
        b.grad = torch.randn(4)
        opt.step()
        M = M * 0.5 + G
        expected = expected * (1 - 0.1 * 0.2) - 0.1 * M.sign()
    torch.testing.assert_close(W.detach(), expected, rtol=1e-6, atol=1e-7)
    assert set(opt.state[W]) == {"momentum"}
    # state_dict round trip through a fresh optimizer.
    W2 = W.detach().clone().requires_grad_()
    b2 = b.detach().clone().requires_grad_()
    opt2 = dion_cpp.SignDescent([{"params": [W2]}, {"params": [b2], "algorithm": "adamw"}], lr=0.1, mu=0.5)
    opt2.load_state_dict(opt.state_dict())
    torch.testing.assert_close(opt2.state[W2]["momentum"], opt.state[W]["momentum"])
    with pytest.raises(ValueError, match=r"invalid mu = 1 \(must be < 1 for sign_descent\)"):
        dion_cpp.SignDescent([torch.zeros(2, 2, requires_grad=True)], mu=1.0)


def test_plugin_errors_name_the_path():
    with pytest.raises(ValueError, match=r"'/nonexistent/x.so': cannot be loaded"):
        dion_cpp.load_algorithm_plugin("/nonexistent/x.so")
