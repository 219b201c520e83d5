"""The optimizer classes of dion_cpp: thin torch.optim.Optimizer shells over the C++ library.

What it is: one base class, `_CppOptimizer`, that keeps a C++ dion optimizer (dion_cpp._C)
over the same parameter tensors, plus the reference's five public classes with the
reference's constructor signatures and defaults (microsoft/dion: Muon, NorMuon, Dion2,
NorDion2 = Dion3, Dion). Every step:
  1. each Python param group's hyperparameters are pushed into the C++ group (so LR
     schedulers and manual edits of group["lr"] etc. take effect; C++ validates them);
  2. the C++ step runs (GIL released);
  3. group["step"] and `state` are refreshed from C++: opt.state[p]["momentum"] IS the C++
     state tensor, so it is live.
state_dict() / load_state_dict() are torch.optim's, with the reference's state keys
(momentum, variance, variance_neuron, Q, step_dev); load_state_dict writes into the C++ state.

What it is not: no math, no validation. Errors come from C++ as ValueError, TypeError or
NotImplementedError carrying the library's message (which names the group and the option).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist
from torch.optim.optimizer import Optimizer, ParamsT

from . import _C


@dataclass
class DionMixedPrecisionConfig:
    """State dtypes for Dion (None: the parameter's dtype), as the reference's class."""

    momentum_dtype: Optional[torch.dtype] = None
    Q_dtype: Optional[torch.dtype] = None
    variance_dtype: Optional[torch.dtype] = None


def _single_process(mesh, name: str) -> None:
    """Accept no mesh, or a process group / device mesh of one rank; refuse the rest."""
    if mesh is None:
        return
    if isinstance(mesh, dist.ProcessGroup):
        size = dist.get_world_size(mesh)
    elif hasattr(mesh, "size") and hasattr(mesh, "get_group"):  # DeviceMesh
        size = mesh.size()
    else:
        raise TypeError(f"{name} must be a DeviceMesh or ProcessGroup, got {type(mesh)}")
    if size != 1:
        raise NotImplementedError(
            f"{name} with {size} ranks: dion_cpp's Python classes run single-process for now; "
            "use the C++ API (dion::dist::Distributed) for DDP / FSDP")


class _CppOptimizer(Optimizer):
    """Base class. `kind` names the C++ class and `algorithm` its matrix algorithm;
    `eager_state` mirrors the reference, whose DistributedOrthoBase family creates every
    parameter's state at construction while legacy Dion creates it at the first step."""

    kind: str = "any"
    algorithm: str = "muon"
    eager_state: bool = True

    def __init__(self, params: ParamsT, hyper: dict, extra: dict):
        # C++ first: it validates the constructor's hyperparameters (betas included) and then
        # receives every group through add_param_group, which Optimizer.__init__ calls.
        self._cpp = _C.Optimizer(self.kind, {**hyper, **extra})
        hyper = dict(hyper)
        beta1, beta2 = hyper.pop("betas")
        defaults = dict(hyper, beta1=beta1, beta2=beta2, algorithm=self.algorithm, step=0)
        super().__init__(params, defaults)
        if self.eager_state:
            self.init_state()

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._cpp.add_param_group(group["params"], group)
        except BaseException:
            self.param_groups.pop()
            raise
        if self.eager_state and getattr(self, "_ready", False):
            self.init_state()

    def _push_groups(self) -> None:
        for i, group in enumerate(self.param_groups):
            self._cpp.set_group(i, group)

    # ------------------------------------------------------------------ state
    def _pull_state(self) -> None:
        """Point self.state at the C++ state tensors (the same tensor objects)."""
        for group in self.param_groups:
            for p in group["params"]:
                st = self._cpp.state(p)
                if st is not None:
                    self.state[p].update(st)

    def init_state(self) -> None:
        """Create every parameter's state now (legacy Dion otherwise does it at step 1)."""
        self._cpp.init_state()
        self._pull_state()
        self._ready = True

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._push_groups()
        self._cpp.step()
        for i, group in enumerate(self.param_groups):
            group["step"] = self._cpp.group_step(i)
        self._pull_state()
        return loss

    # ------------------------------------------------------------------ checkpoints
    def load_state_dict(self, state_dict: dict) -> None:
        # torch.optim casts floating state to the parameter's dtype (an fp32 step_dev or a
        # mixed-precision Q would change dtype); keep the saved dtypes instead.
        saved_dtypes = {
            (pid, key): value.dtype
            for pid, st in state_dict["state"].items()
            for key, value in st.items()
            if isinstance(value, torch.Tensor)
        }
        saved_ids = list(chain.from_iterable(g["params"] for g in state_dict["param_groups"]))
        super().load_state_dict(state_dict)
        params = list(chain.from_iterable(g["params"] for g in self.param_groups))
        by_id = dict(zip(saved_ids, params))
        for pid in state_dict["state"]:
            p = by_id[pid]
            for key, value in list(self.state[p].items()):
                if not isinstance(value, torch.Tensor):
                    continue
                # A copy: the optimizer updates its state in place and must not write into
                # the caller's state_dict (torch.optim's load keeps same-dtype tensors as is).
                value = value.to(dtype=saved_dtypes[(pid, key)], copy=True).contiguous()
                self._cpp.set_state(p, key, value)
                self.state[p][key] = value
        # A checkpoint without AdamW's device step counter (legacy Dion's, or one written
        # before the reference had it) resumes from the group's step, as the reference does.
        for group in self.param_groups:
            if group["algorithm"] != "adamw":
                continue
            for p in group["params"]:
                if self.state.get(p) and "step_dev" not in self.state[p]:
                    step = torch.full((), float(group["step"]), dtype=torch.float32, device=p.device)
                    self._cpp.set_state(p, "step_dev", step)
                    self.state[p]["step_dev"] = step
        self._push_groups()


def _ortho(use_gram_newton_schulz, use_triton, use_polar_express, newton_schulz_func):
    """The orthogonalizer keywords; use_triton is accepted and ignored (C++ kernels run)."""
    return dict(use_gram_newton_schulz=use_gram_newton_schulz, use_triton=use_triton,
                use_polar_express=use_polar_express, newton_schulz_func=newton_schulz_func)


# ---------------------------------------------------------------------------- the classes
# Signatures and defaults are the reference's (microsoft/dion); group keys likewise.


class Muon(_CppOptimizer):
    """Muon (reference: dion/muon.py)."""

    kind = algorithm = "muon"

    def __init__(self, params: ParamsT, distributed_mesh=None, lr: float = 0.01, mu: float = 0.95,
                 betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01,
                 cautious_wd: bool = False, epsilon: float = 1e-8, nesterov: bool = False,
                 adjust_lr: Optional[str] = "spectral_norm", flatten: bool = False,
                 use_gram_newton_schulz: bool = False, use_triton: bool = False,
                 use_polar_express: bool = True, newton_schulz_func: Optional[Callable] = None):
        _single_process(distributed_mesh, "distributed_mesh")
        hyper = dict(lr=lr, mu=mu, betas=betas, weight_decay=weight_decay, cautious_wd=cautious_wd,
                     epsilon=epsilon, nesterov=nesterov, flatten=flatten, adjust_lr=adjust_lr)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func))


class NorMuon(_CppOptimizer):
    """NorMuon (reference: dion/normuon.py)."""

    kind = algorithm = "normuon"

    def __init__(self, params: ParamsT, distributed_mesh=None, lr: float = 0.01, mu: float = 0.95,
                 muon_beta2: float = 0.95, betas: Tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.01, cautious_wd: bool = False, epsilon: float = 1e-8,
                 nesterov: bool = False, adjust_lr: Optional[str] = "spectral_norm",
                 flatten: bool = False, use_gram_newton_schulz: bool = False,
                 use_triton: bool = False, use_polar_express: bool = True,
                 newton_schulz_func: Optional[Callable] = None):
        _single_process(distributed_mesh, "distributed_mesh")
        hyper = dict(lr=lr, mu=mu, muon_beta2=muon_beta2, betas=betas, weight_decay=weight_decay,
                     cautious_wd=cautious_wd, epsilon=epsilon, nesterov=nesterov, flatten=flatten,
                     adjust_lr=adjust_lr)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func))


class Dion2(_CppOptimizer):
    """Dion2 (reference: dion/dion2.py). verbose and triton_post_ortho are accepted and ignored."""

    kind = algorithm = "dion2"

    def __init__(self, params: ParamsT, distributed_mesh=None, lr: float = 0.01,
                 fraction: float = 0.25, ef_decay: float = 0.95,
                 betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01,
                 epsilon: float = 1e-8, adjust_lr: Optional[str] = "spectral_norm",
                 flatten: bool = False, use_triton: bool = False, use_polar_express: bool = True,
                 use_gram_newton_schulz: bool = False, newton_schulz_func: Optional[Callable] = None,
                 verbose: bool = False, triton_post_ortho: bool = False,
                 selection_scope: str = "local"):
        _single_process(distributed_mesh, "distributed_mesh")
        hyper = dict(lr=lr, ef_decay=ef_decay, fraction=float(fraction), betas=betas,
                     weight_decay=weight_decay, epsilon=epsilon, flatten=flatten,
                     adjust_lr=adjust_lr, selection_scope=selection_scope)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func))
        self.verbose = verbose


class NorDion2(_CppOptimizer):
    """NorDion2 (reference: dion/nordion2.py); also exported as Dion3. mu is the error-feedback
    decay here. triton_post_ortho is accepted and ignored."""

    kind = algorithm = "nordion2"

    def __init__(self, params: ParamsT, distributed_mesh=None, lr: float = 0.01,
                 fraction: float = 0.25, mu: float = 0.95, muon_beta2: float = 0.95,
                 betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01,
                 epsilon: float = 1e-8, adjust_lr: Optional[str] = "spectral_norm",
                 flatten: bool = False, use_triton: bool = False, use_polar_express: bool = True,
                 use_gram_newton_schulz: bool = False, newton_schulz_func: Optional[Callable] = None,
                 triton_post_ortho: bool = False, selection_scope: str = "local"):
        _single_process(distributed_mesh, "distributed_mesh")
        hyper = dict(lr=lr, fraction=float(fraction), mu=mu, muon_beta2=muon_beta2, betas=betas,
                     weight_decay=weight_decay, epsilon=epsilon, flatten=flatten,
                     adjust_lr=adjust_lr, selection_scope=selection_scope)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func))


# Dion3 is NorDion2 under its third-generation name: an alias, not a subclass.
Dion3 = NorDion2


class Dion(_CppOptimizer):
    """Legacy Dion: low-rank power iteration (reference: dion/dion.py). 2-D matrices only.
    replicate_mesh_grad_sync and cqr_warmup_steps are accepted and ignored (single process);
    power_iters must be 1 and qr_method 'rcqr', as in the reference."""

    kind = algorithm = "dion"
    eager_state = False  # the reference creates state (and draws Q) at the first step

    def __init__(self, params: ParamsT, replicate_mesh=None, outer_shard_mesh=None,
                 inner_shard_mesh=None, replicate_mesh_grad_sync: bool = True,
                 rank_fraction: float = 1.0, rank_multiple_of: int = 1, lr: float = 0.01,
                 mu: float = 0.95, betas: Tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.01, epsilon: float = 1e-8, power_iters: int = 1,
                 qr_method: str = "rcqr", cqr_warmup_steps: int = 150,
                 rcqr_oversample: float = 1.25,
                 mixed_precision_config: Optional[DionMixedPrecisionConfig] = None):
        _single_process(replicate_mesh, "replicate_mesh")
        _single_process(outer_shard_mesh, "outer_shard_mesh")
        _single_process(inner_shard_mesh, "inner_shard_mesh")
        hyper = dict(rank_fraction=rank_fraction, rank_multiple_of=rank_multiple_of, lr=lr, mu=mu,
                     betas=betas, weight_decay=weight_decay, epsilon=epsilon,
                     oversample=rcqr_oversample)
        super().__init__(params, hyper, dict(power_iters=power_iters, qr_method=qr_method,
                                             mixed_precision_config=mixed_precision_config))
