"""state_dict() / load_state_dict() of the dion_cpp optimizers (a mixin of _CppOptimizer):
torch.optim's format with the algorithms' own state keys (the C++ state table,
Optimizer::state_specs), loaded all or nothing."""
from __future__ import annotations

from itertools import chain

import torch
from torch.optim.optimizer import Optimizer

from . import _C
from . import _checks
from ._dist import _is_dtensor


class _StateDict:
    """state_dict / load_state_dict over the C++ state (see _optimizers._CppOptimizer)."""

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self):
        sd = super().state_dict()
        if self.live_hyperparams:
            # As the reference: 0-d tensor hyperparameters (lr, a scheduler's initial_lr, a
            # live weight_decay) are written as Python numbers; load refills the tensors.
            for group in sd["param_groups"]:
                for key, value in group.items():
                    if key != "params" and isinstance(value, torch.Tensor) and value.ndim == 0:
                        group[key] = value.item()
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """torch.optim's load, all or nothing: the whole state dict is checked first (groups by
        the C++ group checks, every state tensor's key, dtype and shape), and should anything
        still fail while loading, the optimizer is put back exactly as it was.

        State tensors are copied (never aliased with the caller's dict) and cast to the dtype the
        optimizer itself keeps for them, on the parameter's device: the parameter's dtype (as
        torch.optim casts floating state), step_dev float32, Dion's mixed-precision momentum / Q
        their configured dtypes. Non-floating state (an int64 momentum) is refused (TypeError).
        Parameters without saved state start afresh at the next step, as with torch.optim."""
        self._sync_structure()  # param_groups edits first: the state dict is matched to them
        targets = self._check_loadable(state_dict)
        backup = self._backup()
        try:
            self._load(state_dict, targets)
        except BaseException:
            self._restore(backup)
            raise

    def _check_loadable(self, state_dict: dict) -> dict:
        """Refuse a state dict that does not fit, before anything changes. Returns
        {(param id, key): dtype to load as}."""
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError("loading optimizer state: expected a dict with 'state' and "
                             "'param_groups' (from state_dict())")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loading optimizer state: the state dict has {len(saved_groups)} "
                             f"param groups, this optimizer {len(self.param_groups)}")
        by_id = {}
        algorithms = []
        for g, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"loading optimizer state: param group {g} has "
                                 f"{len(saved['params'])} parameters in the state dict, "
                                 f"{len(group['params'])} in this optimizer")
            options = {k: v for k, v in saved.items() if k != "params"}
            try:  # the C++ checks of a group edit; nothing changes
                # lr and the live hyperparameters must be in the saved group itself: the load
                # replaces the group's dict with it (torch.optim's load), defaults do not refill it.
                for key in dict.fromkeys(("lr",) + tuple(self._live_hyperparams(g))):
                    if key not in options:
                        raise KeyError(key)
                self._cpp.check_group(g, options)
            except (ValueError, TypeError, NotImplementedError) as e:
                raise type(e)(f"loading optimizer state: {e}") from None
            except KeyError as e:  # a group without a hyperparameter this optimizer needs
                raise ValueError(
                    f"loading optimizer state: param group {g} of the state dict has no {e.args[0]!r} "
                    f"(it has {sorted(options)}): not a state_dict() of a {type(self).__name__}? Load "
                    "what this optimizer's state_dict() wrote") from None
            algorithms.append(options.get("algorithm", group["algorithm"]))
            for j, (pid, p) in enumerate(zip(saved["params"], group["params"])):
                by_id[pid] = (g, j, p)
        targets = {}
        for pid, saved_state in state_dict["state"].items():
            if pid not in by_id:
                raise ValueError(f"loading optimizer state: state for parameter id {pid!r}, which "
                                 "no param group of the state dict lists")
            g, j, p = by_id[pid]
            tensors = {k: v for k, v in saved_state.items() if isinstance(v, torch.Tensor)}
            if not tensors:
                continue  # no state saved: the parameter starts afresh, as with torch.optim
            where = (f"loading optimizer state: param group {g}, parameter {j} of shape "
                     f"{list(p.shape)}")
            # What the group keeps (the C++ state table, Optimizer::state_specs), under the
            # options the load gives it: {key: (shape, dtype)}.
            options = {k: v for k, v in state_dict["param_groups"][g].items() if k != "params"}
            specs = self._cpp.state_specs(g, self._cpp_param(p), options)
            needs = f"a {algorithms[g]} parameter's state is {', '.join(specs)}"
            for key, value in tensors.items():
                known = _C.state_keys()  # what any registered algorithm keeps
                if key not in known:
                    raise ValueError(f"{where}: '{key}': unknown state key (known: {', '.join(known)})")
                if key not in specs:
                    raise ValueError(f"{where}: '{key}' is not state of this group ({needs}; a "
                                     "checkpoint of another optimizer or algorithm?)")
                if not value.is_floating_point():
                    raise TypeError(f"{where}: '{key}' has dtype {value.dtype}; optimizer state must "
                                    "be floating point (a checkpoint of another optimizer?)")
                local = value._local_tensor if _is_dtensor(value) else value
                want = tuple(specs[key][0])
                if tuple(local.shape) != want:
                    raise ValueError(f"{where}: '{key}' has shape {list(local.shape)}, expected "
                                     f"{list(want)} (a checkpoint of another model?)")
                targets[(pid, key)] = specs[key][1]
            # A counter (AdamW's device step) may be absent (legacy Dion's checkpoints, or ones
            # written before the reference had it): _load resumes it from the group's step.
            missing = [key for key in specs if key not in tensors and not specs[key][2]]
            if missing:
                raise ValueError(f"{where}: state '{', '.join(missing)}' missing ({needs}; a "
                                 "truncated or hand-edited checkpoint?)")
        return targets

    def _backup(self) -> dict:
        """What _restore needs to undo a load: the group and state containers, the C++ state
        tensors (load replaces them, never writes into them) and the live hyperparameters."""
        params = [p for group in self.param_groups for p in group["params"]]
        return dict(groups=self.param_groups, state=self.state,
                    cpp={p: dict(self._cpp.state(self._cpp_param(p)) or {}) for p in params},
                    hyper={k: (t, t.clone()) for k, t in self._hyperparam_tensors.items()})

    def _restore(self, backup: dict) -> None:
        Optimizer.__setstate__(self, {"state": backup["state"], "param_groups": backup["groups"]})
        self._registered = _checks.structure_of(self.param_groups)
        for key, (tensor, value) in backup["hyper"].items():
            tensor.copy_(value)
            self._hyperparam_tensors[key] = tensor
        for i, group in enumerate(self.param_groups):
            self._cpp.set_group(i, group)
        for p, st in backup["cpp"].items():
            local = self._cpp_param(p)
            self._cpp.clear_state(local)
            for key, value in st.items():
                self._cpp.set_state(local, key, value)

    def _load(self, state_dict: dict, targets: dict) -> None:
        saved_ids = list(chain.from_iterable(g["params"] for g in state_dict["param_groups"]))
        super().load_state_dict(state_dict)  # new group dicts over the same parameters
        self._registered = _checks.structure_of(self.param_groups)
        params = list(chain.from_iterable(g["params"] for g in self.param_groups))
        by_id = dict(zip(saved_ids, params))
        self._sync_hyperparam_tensors()
        for i, group in enumerate(self.param_groups):  # groups first: a new algorithm drops state
            self._cpp.set_group(i, group)
        loaded = {by_id[pid] for pid in state_dict["state"]}
        for p in params:
            self._cpp.clear_state(self._cpp_param(p))  # the checkpoint's state replaces all state
        for pid, saved_state in state_dict["state"].items():
            p = by_id[pid]
            device = self._cpp_param(p).device
            for key, value in saved_state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                # A copy, cast from the saved tensor (torch.optim has cast it to the parameter's
                # dtype already, which would round an fp32 step_dev through bf16).
                if _is_dtensor(value):  # a DTensor's local tensor already is on its rank's device
                    value = value.to(dtype=targets[(pid, key)], copy=True).contiguous()
                else:
                    value = value.to(dtype=targets[(pid, key)], device=device, copy=True).contiguous()
                local = value._local_tensor if _is_dtensor(value) else value
                self._cpp.set_state(self._cpp_param(p), key, local)
                self.state[p][key] = value
        # A checkpoint without a counter state (AdamW's device step: legacy Dion's checkpoints, or
        # ones written before the reference had it) resumes it from the group's step, as the
        # reference does.
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p not in loaded or not self.state.get(p):
                    continue
                specs = self._cpp.state_specs(g, self._cpp_param(p), {})
                for key, (shape, dtype, from_step) in specs.items():
                    if from_step and key not in self.state[p]:
                        step = torch.full(tuple(shape), float(group["step"]), dtype=dtype,
                                          device=self._cpp_param(p).device)
                        self._cpp.set_state(self._cpp_param(p), key, step)
                        self.state[p][key] = step
