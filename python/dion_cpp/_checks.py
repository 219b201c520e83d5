"""The drop-in's torch.optim semantics: what a torch.optim user may do between steps, checked
(or followed) at every step, so that the C++ optimizer never runs on something it was not told.

What it is: three checks the optimizer classes (_optimizers.py) run at step time.
  check_grads       every gradient has its parameter's shape, dtype and device (metadata only:
                    `p.grad.data = x` bypasses torch's own check on `p.grad = x`);
  structure_of /    the parameters of each param group as C++ holds them, against the current
  describe_change   `param_groups` (a parameter appended, replaced or removed, a group deleted):
                    the optimizer follows the change (single process) or refuses it (distributed);
  ReplicaCheck      with torch.distributed initialized, every rank of the group has the same
                    options (every hyperparameter, algorithm, step count, parameter shapes and
                    dtypes), checked at every step with one small all_reduce of a hash, so that
                    replicas cannot drift apart silently. A difference raises on every rank
                    (ValueError naming the group, the key and each rank's value); a rank that does
                    not step makes the others raise after `timeout` seconds instead of hanging.

What it is not: no hyperparameter ranges (the C++ table, dion/optim/hyperparameters.h) and no
state-dict checks (the optimizer's load_state_dict, against the C++ state table).
"""
from __future__ import annotations

import hashlib
import math
import struct
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from . import _C


def _param_name(group: dict, j: int) -> str:
    names = group.get("param_names")  # torch.optim's named parameters (params=model.named_parameters())
    return f" '{names[j]}'" if names is not None and j < len(names) else ""


def _meta(t: torch.Tensor) -> str:
    return f"shape {list(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_grads(param_groups: Sequence[dict]) -> None:
    """RuntimeError (as torch's `p.grad = x` raises) when a gradient's shape, dtype or device is
    not its parameter's."""
    for g, group in enumerate(param_groups):
        for j, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None:
                continue
            if grad.shape != p.shape or grad.dtype != p.dtype or grad.device != p.device:
                raise RuntimeError(
                    f"param group {g}, parameter {j}{_param_name(group, j)}: the gradient "
                    f"({_meta(grad)}) does not match the parameter ({_meta(p)}); a gradient must "
                    "have its parameter's shape, dtype and device (was p.grad.data assigned?)")


# ---------------------------------------------------------------------------- param_groups edits
def structure_of(param_groups: Sequence[dict]) -> List[tuple]:
    """(the group dict, its parameters) for each group: what C++ was given. Groups are compared
    by their parameters only: a group dict replaced by one over the same parameters (as
    load_state_dict does) is the same group, its new values are pushed as any edit."""
    return [(group, tuple(group["params"])) for group in param_groups]


def same_structure(registered: List[tuple], param_groups: Sequence[dict]) -> bool:
    if len(registered) != len(param_groups):
        return False
    for (_, params), now in zip(registered, param_groups):
        current = now["params"]
        if len(current) != len(params) or any(a is not b for a, b in zip(params, current)):
            return False
    return True


def describe_change(registered: List[tuple], param_groups: Sequence[dict]) -> str:
    """What changed, in words ("param group 0: 1 parameter added, 1 removed")."""
    if len(registered) != len(param_groups):
        return f"{len(registered)} param groups became {len(param_groups)}"
    for g, ((_, params), now) in enumerate(zip(registered, param_groups)):
        before, after = {id(p) for p in params}, {id(p) for p in now["params"]}
        if before != after:
            return (f"param group {g}: {len(after - before)} parameter(s) added, "
                    f"{len(before - after)} removed")
        if len(params) != len(now["params"]) or any(a is not b for a, b in zip(params, now["params"])):
            return f"param group {g}: its parameters were reordered or repeated"
    return "no change"


def check_new_params(param_groups: Sequence[dict]) -> None:
    """torch.optim's add_param_group checks, for parameters put into param_groups by hand."""
    seen = {}
    for g, group in enumerate(param_groups):
        if not isinstance(group.get("params"), (list, tuple)):
            raise TypeError(f"param group {g}: 'params' must be a list of tensors, got "
                            f"{type(group.get('params')).__name__}")
        for j, p in enumerate(group["params"]):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"param group {g}, parameter {j}: optimizer can only optimize "
                                f"Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"param group {g}, parameter {j}: can't optimize a non-leaf Tensor")
            if id(p) in seen:
                raise ValueError(f"param group {g}, parameter {j}: the same tensor is parameter "
                                 f"{seen[id(p)][1]} of param group {seen[id(p)][0]}; some "
                                 "parameters appear in more than one parameter group")
            seen[id(p)] = (g, j)


# ---------------------------------------------------------------------------- replicas
DEFAULT_TIMEOUT_S = 600.0


def describe(opt) -> list:
    """[(where, key, value)]: everything that must be equal on every rank for replicas to stay
    equal: each group's algorithm and hyperparameters as C++ holds them (after the push), its
    step count, and each parameter's (global) shape and dtype."""
    out = [("optimizer", "class", type(opt).__name__), ("optimizer", "param groups", len(opt.param_groups))]
    for i, group in enumerate(opt.param_groups):
        where = f"param group {i}"
        for key, value in sorted(opt._cpp.group_options(i).items()):
            out.append((where, key, value))
        out.append((where, "step", opt._cpp.group_step(i)))
        out.append((where, "parameters", len(group["params"])))
        for j, p in enumerate(group["params"]):
            out.append((f"{where}, parameter {j}", "shape and dtype", (tuple(p.shape), str(p.dtype))))
    return out


def _digest(desc: list) -> List[int]:
    """Two 62-bit integers from a hash of `desc` (and their negations: one MAX all_reduce then
    yields both the largest and the smallest value over the ranks)."""
    h = hashlib.sha256(repr(desc).encode()).digest()
    a, b = (int.from_bytes(h[k:k + 8], "little") & ((1 << 62) - 1) for k in (0, 8))
    return [a, b, -a, -b]


class ReplicaCheck:
    """Every rank of `group` agrees on describe(opt), checked at each step (collective: every rank
    of the group must step). `timeout`: seconds to wait for the other ranks."""

    def __init__(self, group, timeout: float = DEFAULT_TIMEOUT_S):
        self.group = group
        self.timeout = timeout

    def __call__(self, opt) -> None:
        desc = describe(opt)
        device = torch.device("cpu")
        if dist.get_backend(self.group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        # Through _C.all_reduce_max, not dist.all_reduce: its tensor is never a Python object
        # (a Python tensor whose last reference Gloo's thread drops at interpreter exit aborts
        # the process: docs/distributed.md, "Two-rank exits").
        try:
            top = _C.all_reduce_max(self.group, _digest(desc), str(device), self.timeout)
        except RuntimeError as e:
            raise RuntimeError(
                f"{type(opt).__name__}.step(): the other ranks of the process group did not step "
                f"within {self.timeout:g} s (the replica check is collective: every rank of the "
                f"group must call step(); {e})") from None
        if top[0] == -top[2] and top[1] == -top[3]:
            return
        # Some rank differs: every rank saw it, so every rank gathers the descriptions.
        every = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, desc, group=self.group)
        raise ValueError(_disagreement(type(opt).__name__, every, dist.get_process_group_ranks(self.group)))


def _show(v) -> str:
    """A value for the message: a float that is a float32 (a live 0-d lr tensor's) as the shortest
    decimal that reads back as that float32 (0.01, not 0.009999999776482582)."""
    if isinstance(v, tuple):
        return "(" + ", ".join(_show(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, float) and math.isfinite(v):
        try:
            as32 = struct.unpack("f", struct.pack("f", v))[0]
        except OverflowError:
            as32 = None
        if as32 == v:
            for digits in range(1, 10):
                text = f"{v:.{digits}g}"
                if struct.unpack("f", struct.pack("f", float(text)))[0] == v:
                    return text if any(c in text for c in ".e") else text + ".0"
    return repr(v)


def _disagreement(name: str, every: list, ranks: Sequence[int]) -> str:
    keys = []
    for desc in every:
        for where, key, _ in desc:
            if (where, key) not in keys:
                keys.append((where, key))
    values = [{(w, k): v for w, k, v in desc} for desc in every]
    for where, key in keys:
        seen = [v.get((where, key), "<absent>") for v in values]
        if any(s != seen[0] for s in seen):
            each = ", ".join(f"rank {r} has {_show(s)}" for r, s in zip(ranks, seen))
            return (f"{name}.step(): the ranks disagree on {where}, '{key}': {each}. Replicated "
                    "parameters would drift apart: give every rank the same optimizer options (or, "
                    "when the ranks deliberately optimize different parameters, e.g. pipeline "
                    "stages, set optimizer.replica_check = False)")
    return f"{name}.step(): the ranks' optimizer options differ (hash mismatch) but no key differs"
