"""The optimizer classes of dion_cpp: thin torch.optim.Optimizer shells over the C++ library.

What it is: one base class, `_CppOptimizer`, that keeps a C++ dion optimizer (dion_cpp._C)
over the same parameter tensors, plus the reference's five public classes with the
reference's constructor signatures and defaults (microsoft/dion: Muon, NorMuon, Dion2,
NorDion2 = Dion3, Dion). Every step:
  1. edits of param_groups' structure (a parameter appended, replaced, a group deleted) are
     followed as torch.optim follows them: the C++ optimizer is rebuilt over the current groups
     (single process; refused when distributed);
  2. each Python param group's hyperparameters are pushed into the C++ group (so LR
     schedulers and manual edits of group["lr"] etc. take effect; C++ validates them);
  3. every gradient's metadata is checked against its parameter's, and with torch.distributed
     initialized every rank's options are checked equal (_checks.py);
  4. the C++ step runs (GIL released);
  5. group["step"] and `state` are refreshed from C++: opt.state[p]["momentum"] IS the C++
     state tensor, so it is live.
state_dict() / load_state_dict() are torch.optim's, with the reference's state keys
(momentum, variance, variance_neuron, Q, step_dev); load_state_dict writes into the C++ state,
all or nothing (checked first, rolled back on a later failure). As in the reference,
group["lr"] of the DistributedOrthoBase family is a persistent 0-d float32 tensor (so LR
schedulers compute exactly as there); state_dict() writes it as a number. Copies and pickles
of an optimizer are refused (TypeError): the state lives in C++.

Distributed (the reference's conventions, megabatch_base.py): `distributed_mesh` is a
torch.distributed ProcessGroup (DDP: parameters replicated, gradients already averaged) or a 1-D
DeviceMesh (its group). DTensor parameters (FSDP2 fully_shard, distribute_tensor) with one
Shard(dim) placement over that group are sharded: the C++ optimizer works on their local
tensors (`_local_tensor`, the same storage), registered with the global shape and dim, and
receives their local gradients before each step; Replicate() placements are replicated. The
C++ step then runs its DDP / FSDP layouts (docs/distributed.md) over the group's own backends
(Gloo for CPU tensors, NCCL for CUDA tensors), from the thread that calls step().
State tensors of DTensor parameters are handed back as DTensors over the same local storage.
Legacy Dion takes the reference's replicate_mesh / outer_shard_mesh / inner_shard_mesh instead:
DTensor parameters on a mesh whose dims are those 1-D sub-meshes are registered with their
outer- (FSDP) and inner- (TP) sharded tensor dims; replicate_mesh adds HSDP's replicas.

What it is not: no math, and no validation of hyperparameters or groups: errors come from C++
as ValueError, TypeError or NotImplementedError carrying the library's message (which names the
group and the option). Python checks what C++ never sees: before a load the state dict's
structure and its state tensors' keys, dtypes and shapes (against the C++ state table,
state_specs), and at each step what _checks.py checks (gradients, param_groups' structure,
agreement across ranks).
"""
from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist
from torch.optim.optimizer import Optimizer, ParamsT

from . import _C
from . import _checks

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh as _DeviceMesh
    from torch.distributed.tensor import DTensor as _DTensor
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:  # older torch: no strided shards
        _StridedShard = None
else:  # a torch build without distributed: no meshes, no DTensors
    _DeviceMesh = _DTensor = _StridedShard = None


# Distributed optimizers alive, released at interpreter exit (_release_at_exit).
_distributed_optimizers: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _release_at_exit() -> None:
    """Drop the C++ side of every distributed optimizer still alive when the interpreter exits
    (PyOptimizer::release): its references to torch's ProcessGroups go now, while the interpreter
    and c10d are whole, not in the interpreter's teardown or never (an optimizer left in a
    reference cycle), where Gloo's threads ran into exit()'s static destructors (SIGABRT).
    Registered after torch's import, so it runs before torch's own atexit handlers."""
    for opt in list(_distributed_optimizers):
        cpp = opt.__dict__.get("_cpp")
        if cpp is not None:
            cpp.release()


@dataclass
class DionMixedPrecisionConfig:
    """State dtypes for Dion (None: the parameter's dtype), as the reference's class."""

    momentum_dtype: Optional[torch.dtype] = None
    Q_dtype: Optional[torch.dtype] = None
    variance_dtype: Optional[torch.dtype] = None


def _is_dtensor(t) -> bool:
    return _DTensor is not None and isinstance(t, _DTensor)


def _group_of(mesh, name: str):
    """The ProcessGroup of a distributed_mesh (None, a ProcessGroup or a 1-D DeviceMesh), or
    None when there is nothing to distribute over (no mesh, or one rank)."""
    if mesh is None:
        return None
    if not dist.is_available():
        raise TypeError(f"{name}: torch.distributed is not available in this torch build")
    if isinstance(mesh, _DeviceMesh):
        if mesh.ndim != 1:
            raise ValueError(
                f"{name}: Only 1D DeviceMesh supported, but got {mesh.ndim}D. "
                "For HSDP, provide the 1D sharded sub-mesh.")
        group = mesh.get_group()
    elif isinstance(mesh, dist.ProcessGroup):
        group = mesh
    else:
        raise TypeError(f"Invalid {name} type: {type(mesh)}. Expected DeviceMesh or ProcessGroup.")
    return group if dist.get_world_size(group) > 1 else None


def _shard_mesh_group(mesh, name: str, replicate_mesh):
    """Legacy Dion's outer_shard_mesh / inner_shard_mesh (None or a 1-D DeviceMesh, checked as
    the reference does): its ProcessGroup, or None when it is absent or has one rank."""
    if mesh is None:
        return None
    label = name.split("_")[0].capitalize()
    if _DeviceMesh is None or not isinstance(mesh, _DeviceMesh):
        raise TypeError(f"{label} shard mesh must be a DeviceMesh, but got {type(mesh)}.")
    if mesh.ndim != 1:
        raise ValueError(f"{label} shard mesh must be 1D, but got {mesh.ndim}D. Try using a 1D sub-mesh.")
    if mesh == replicate_mesh:
        raise ValueError(f"{label} shard mesh must be different from replicate mesh.")
    group = mesh.get_group()
    return group if dist.get_world_size(group) > 1 else None


class _CppOptimizer(Optimizer):
    """Base class. `kind` names the C++ class and `algorithm` its matrix algorithm;
    `eager_state` mirrors the reference, whose DistributedOrthoBase family creates every
    parameter's state at construction while legacy Dion creates it at the first step."""

    kind: str = "any"
    algorithm: str = "muon"
    eager_state: bool = True
    # The reference's DistributedOrthoBase family carries group["lr"] (and a Tensor
    # weight_decay) as a persistent 0-d float32 tensor on the parameters' device; legacy Dion
    # keeps plain floats. A scheduler then computes in float32 exactly as it does there.
    live_hyperparams: bool = True

    def __init__(self, params: ParamsT, hyper: dict, extra: dict, group=None,
                 sync_gradients: bool = False):
        # C++ first: it validates the constructor's hyperparameters (betas included) and then
        # receives every group through add_param_group, which Optimizer.__init__ calls.
        # `group`: the ProcessGroup to distribute over (None: single process).
        self._ctor_kwargs = {**hyper, **extra}  # a rebuild after param_groups edits needs them
        self._cpp = _C.Optimizer(self.kind, self._ctor_kwargs)
        self._group = group
        self._registered = []  # (group dict, its parameters) as C++ holds them (_sync_structure)
        # The cross-rank check of step() (_checks.ReplicaCheck): None = automatic (over the
        # distributed_mesh / replicate and shard meshes given, else over the default group when
        # torch.distributed is initialized with more than one rank), False = off, or a
        # ProcessGroup to check over. replica_check_timeout: seconds to wait for the other ranks.
        self.replica_check = None
        self.replica_check_timeout = _checks.DEFAULT_TIMEOUT_S
        self._local = {}  # DTensor parameter -> its local tensor (what C++ holds)
        self._distribute(group, sync_gradients)
        hyper = dict(hyper)
        beta1, beta2 = hyper.pop("betas")
        defaults = dict(hyper, beta1=beta1, beta2=beta2, algorithm=self.algorithm, step=0)
        self._hyperparam_tensors = {}  # (group index, name) -> persistent 0-d float32 tensor
        self._live_hyperparams_by_group = {}
        super().__init__(params, defaults)
        if self.eager_state:
            self.init_state()
        self._sync_hyperparam_tensors()

    def _distribute(self, group, sync_gradients: bool) -> None:
        """Give the C++ optimizer its distribution (DDP / FSDP over `group`), if any."""
        if group is not None:
            self._cpp.set_distribution(group, dist.get_process_group_ranks(group), sync_gradients)
            _distributed_optimizers.add(self)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict) -> None:
        self._sync_structure()  # earlier edits of param_groups first: C++ groups by index
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._cpp.add_param_group([self._register(p) for p in group["params"]], group)
        except BaseException:
            self.param_groups.pop()
            raise
        self._registered.append((group, tuple(group["params"])))
        if getattr(self, "_ready", False):
            if self.eager_state:
                self.init_state()
            self._sync_hyperparam_tensors()

    def _distributed(self) -> bool:
        return self._group is not None or getattr(self, "_sharding", None) is not None

    def _sync_structure(self) -> None:
        """Follow edits of param_groups since the last step, as torch.optim does (its step reads
        the current param_groups): a parameter appended to or replaced in group["params"], a group
        deleted or replaced. Single process: the C++ optimizer is rebuilt over the current groups,
        keeping the state of the parameters that stay (new ones start afresh). Distributed: the
        parameters' layout over the group cannot change: RuntimeError."""
        if _checks.same_structure(self._registered, self.param_groups):
            return
        change = _checks.describe_change(self._registered, self.param_groups)
        if self._distributed():
            raise RuntimeError(
                f"{type(self).__name__}: param_groups were edited after construction ({change}); a "
                "distributed dion_cpp optimizer cannot follow that (its parameters are laid out over "
                "the process group): build a new optimizer over the new parameters")
        _checks.check_new_params(self.param_groups)
        self._rebuild()

    def _rebuild(self) -> None:
        """A new C++ optimizer over the current param_groups (single process), with the state of
        every parameter that stays where its state still fits (same keys and shapes)."""
        old_index = {id(group): i for i, (group, _) in enumerate(self._registered)}
        saved = {}
        for _, params in self._registered:
            for p in params:
                st = self._cpp.state(self._cpp_param(p))
                if st:
                    saved[p] = st
        cpp = _C.Optimizer(self.kind, self._ctor_kwargs)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            cpp.add_param_group([self._register(p) for p in group["params"]], group)
        live = set()
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                live.add(p)
                st = saved.get(p)
                if not st:
                    continue
                local = self._cpp_param(p)
                specs = cpp.state_specs(g, local, {})
                if set(st) == set(specs) and all(tuple(t.shape) == specs[k][0] for k, t in st.items()):
                    for key, t in st.items():
                        cpp.set_state(local, key, t)
                else:
                    self.state.pop(p, None)  # another algorithm's state: afresh
        self._cpp = cpp
        for p in [p for p in self.state if p not in live]:
            del self.state[p]  # its C++ state went with the old optimizer
        self._local = {p: t for p, t in self._local.items() if p in live}
        tensors, live_by_group = {}, {}
        for g, group in enumerate(self.param_groups):
            i = old_index.get(id(group))
            if i is None:
                continue
            if i in self._live_hyperparams_by_group:
                live_by_group[g] = self._live_hyperparams_by_group[i]
            for (k, name), t in self._hyperparam_tensors.items():
                if k == i:
                    tensors[(g, name)] = t
        self._hyperparam_tensors, self._live_hyperparams_by_group = tensors, live_by_group
        self._registered = _checks.structure_of(self.param_groups)
        self._sync_hyperparam_tensors()
        if self.eager_state:
            self.init_state()
        else:
            self._pull_state()

    def _replica_checks(self) -> None:
        """The cross-rank agreement of step() (replica_check, _checks.ReplicaCheck)."""
        setting = self.replica_check
        if setting is False or not dist.is_available() or not dist.is_initialized():
            return
        if setting is None or setting is True:
            groups = [self._group] if self._group is not None else []
            for g in getattr(self, "_sharding", None) or ():
                if g is not None and all(g is not h for h in groups):
                    groups.append(g)
            if not groups and dist.get_world_size() > 1:
                groups = [dist.group.WORLD]
        else:
            groups = [setting]
        for g in groups:
            _checks.ReplicaCheck(g, self.replica_check_timeout)(self)

    def _push_groups(self) -> None:
        """Push every group into C++ (validated there). A group whose algorithm was edited
        (muon -> adamw) loses its old state; the new algorithm's starts afresh."""
        changed = False
        for i, group in enumerate(self.param_groups):
            if self._cpp.set_group(i, group):
                changed = True
                for p in group["params"]:
                    self.state.pop(p, None)
        if changed and self.eager_state:
            self.init_state()

    # ------------------------------------------------------------------ live hyperparameters
    # The reference's DistributedOrthoBase (megabatch_base.py) keeps group["lr"] as one
    # persistent 0-d float32 tensor per group on the parameters' device, only ever filled; a
    # torch.optim scheduler then clones it as initial_lr and computes every new lr in float32
    # tensor arithmetic (base_lr * factor), which can round differently from Python floats.
    # Keeping the same representation keeps scheduled runs bit-identical. weight_decay joins
    # when the caller supplies a Tensor for it (latching), as there.
    def _live_hyperparams(self, index: int) -> Tuple[str, ...]:
        if not self.live_hyperparams:
            return ()
        live = self._live_hyperparams_by_group.get(index)
        if live is None or "weight_decay" not in live:
            if isinstance(self.param_groups[index].get("weight_decay"), torch.Tensor):
                live = ("lr", "weight_decay")
            elif live is None:
                live = ("lr",)
            self._live_hyperparams_by_group[index] = live
        return live

    def _ensure_hyperparam_tensor(self, index: int, name: str) -> None:
        """Make param_groups[index][name] the group's persistent 0-d float32 tensor, filled with
        whatever the group holds now (a float, or a tensor from a checkpoint)."""
        group = self.param_groups[index]
        if not group["params"]:
            return
        value = group[name]
        tensor = self._hyperparam_tensors.get((index, name))
        if value is tensor:
            return
        device = self._cpp_param(group["params"][0]).device
        if tensor is None or tensor.device != device:
            tensor = torch.empty((), dtype=torch.float32, device=device)
            self._hyperparam_tensors[(index, name)] = tensor
        if isinstance(value, torch.Tensor):
            tensor.copy_(value)
        else:
            tensor.fill_(value)
        group[name] = tensor

    def _sync_hyperparam_tensors(self) -> None:
        for index in range(len(self.param_groups)):
            for name in self._live_hyperparams(index):
                self._ensure_hyperparam_tensor(index, name)

    # ------------------------------------------------------------------ DTensor parameters
    def _register(self, p: torch.Tensor) -> torch.Tensor:
        """The tensor C++ holds for `p`: p itself, or a DTensor's local tensor (registered as a
        shard of p's global shape when p is sharded over the optimizer's group)."""
        if not _is_dtensor(p):
            return p
        if any(pl.is_partial() for pl in p.placements):
            raise ValueError(f"DTensor parameter with placements {p.placements}: Partial() "
                             "parameters are not supported (Shard or Replicate only)")
        mesh = p.device_mesh
        sharded = [(i, pl) for i, pl in enumerate(p.placements) if pl.is_shard() and mesh.size(i) > 1]
        if len(sharded) > 1:
            raise NotImplementedError(
                f"{type(self).__name__} does not support parameters with multiple sharded "
                f"dimensions (placements {p.placements})")
        local = p._local_tensor  # the storage the DTensor reads (to_local() may return a view)
        if sharded:
            axis, placement = sharded[0]
            if self._group is None or mesh.get_group(axis) != self._group:
                raise RuntimeError(
                    f"Got a DTensor sharded over mesh dimension {axis} of {mesh} that is not the "
                    f"optimizer's distributed_mesh: create the optimizer with that (1-D) mesh")
            self._cpp.shard(local, list(p.shape), placement.dim % p.dim())
        self._local[p] = local
        return local

    def _local_of(self, p: torch.Tensor) -> torch.Tensor:
        """A DTensor parameter's local tensor, remembered as what C++ holds for `p`."""
        local = p._local_tensor  # the storage the DTensor reads (to_local() may return a view)
        self._local[p] = local
        return local

    def _cpp_param(self, p: torch.Tensor) -> torch.Tensor:
        return self._local.get(p, p)

    def _push_grads(self) -> None:
        """Give each DTensor parameter's local tensor its local gradient (same placements as
        the parameter: a gradient of other placements is redistributed first)."""
        for p, local in self._local.items():
            g = p.grad
            if g is not None and _is_dtensor(g):
                if tuple(g.placements) != tuple(p.placements):
                    g = g.redistribute(p.device_mesh, p.placements)
                g = g._local_tensor
            local.grad = g

    def _as_state(self, p: torch.Tensor, t: torch.Tensor, old) -> torch.Tensor:
        """C++ state tensor `t` of parameter `p`, as Python sees it: for a DTensor parameter a
        DTensor over the same storage (kept from `old` when it already is one), when `t` has
        the local shape along every sharded dim; otherwise `t` itself."""
        if not _is_dtensor(p) or t.dim() != p.dim():
            return t
        if (_is_dtensor(old) and old._local_tensor.data_ptr() == t.data_ptr()
                and old._local_tensor.shape == t.shape):
            return old
        local = self._local[p]
        shape = list(t.shape)
        for pl in p.placements:
            if pl.is_shard():
                d = pl.dim % p.dim()
                if t.size(d) != local.size(d):
                    return t
                shape[d] = p.size(d)
        wrapped = _DTensor.from_local(t, p.device_mesh, p.placements, run_check=False,
                                      shape=torch.Size(shape),
                                      stride=torch.empty(shape, device="meta").stride())
        # from_local views `t`: the DTensor reads the live C++ state (else: hand out `t`).
        return wrapped if wrapped._local_tensor.data_ptr() == t.data_ptr() else t

    # ------------------------------------------------------------------ state
    def _pull_state(self) -> None:
        """Point self.state at the C++ state tensors (the same tensor objects)."""
        for group in self.param_groups:
            for p in group["params"]:
                st = self._cpp.state(self._cpp_param(p))
                if st is not None:
                    mine = self.state[p]
                    for key, t in st.items():
                        mine[key] = self._as_state(p, t, mine.get(key))

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
        self._sync_structure()
        self._sync_hyperparam_tensors()
        self._push_groups()
        _checks.check_grads(self.param_groups)
        self._replica_checks()
        self._push_grads()
        try:
            self._cpp.step()
        finally:
            for local in self._local.values():
                local.grad = None  # the gradient belongs to the DTensor
        for i, group in enumerate(self.param_groups):
            group["step"] = self._cpp.group_step(i)
        self._pull_state()
        return loss

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
                self._cpp.check_group(g, options)
            except (ValueError, TypeError, NotImplementedError) as e:
                raise type(e)(f"loading optimizer state: {e}") from None
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
                if key not in _STATE_KEYS:
                    raise ValueError(f"{where}: '{key}': unknown state key (known: {', '.join(_STATE_KEYS)})")
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
            missing = [key for key in specs if key not in tensors]
            # AdamW's device step counter may be absent (legacy Dion's checkpoints, or ones written
            # before the reference had it): _load resumes it from the group's step.
            if algorithms[g] == "adamw" and missing == ["step_dev"]:
                missing = []
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
        # A checkpoint without AdamW's device step counter (legacy Dion's, or one written
        # before the reference had it) resumes from the group's step, as the reference does.
        for group in self.param_groups:
            if group["algorithm"] != "adamw":
                continue
            for p in group["params"]:
                if p in loaded and self.state.get(p) and "step_dev" not in self.state[p]:
                    step = torch.full((), float(group["step"]), dtype=torch.float32,
                                      device=self._cpp_param(p).device)
                    self._cpp.set_state(self._cpp_param(p), "step_dev", step)
                    self.state[p]["step_dev"] = step

    # ------------------------------------------------------------------ copies
    def __getstate__(self):
        # torch.optim's copy / pickle support would copy the Python shell without the C++
        # optimizer (whose state and distribution are not Python objects): refuse at copy time.
        raise TypeError(
            f"a dion_cpp {type(self).__name__} cannot be copied or pickled (copy.deepcopy, pickle, "
            "torch.save(optimizer)): its state lives in the C++ library. Save "
            "optimizer.state_dict() instead and load it into a new optimizer with load_state_dict()")


_STATE_KEYS = ("momentum", "variance", "variance_neuron", "Q", "step_dev")


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
        hyper = dict(lr=lr, mu=mu, betas=betas, weight_decay=weight_decay, cautious_wd=cautious_wd,
                     epsilon=epsilon, nesterov=nesterov, flatten=flatten, adjust_lr=adjust_lr)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func),
                         _group_of(distributed_mesh, "distributed_mesh"))


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
        hyper = dict(lr=lr, mu=mu, muon_beta2=muon_beta2, betas=betas, weight_decay=weight_decay,
                     cautious_wd=cautious_wd, epsilon=epsilon, nesterov=nesterov, flatten=flatten,
                     adjust_lr=adjust_lr)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func),
                         _group_of(distributed_mesh, "distributed_mesh"))


# Dion2's verbose report, printed once per (shape, shard dim, selection dim) in the process, as
# the reference's _print_selection_choice (dion/dion2.py).
_printed_selection_configs: set = set()


def _print_selection_choice(shape, shard_dim: Optional[int], selection_dim: str = "shard") -> None:
    """selection_dim "shard" reports the reference's choice (along a sharded matrix dim);
    "shorter" (dion_cpp's default) selects along the shorter dim on 1-D sharded matrices too."""
    ndim = len(shape)
    num_rows, num_cols = shape[-2:]
    normalized = None if shard_dim is None else (shard_dim if shard_dim < 0 else shard_dim - ndim)
    shorter_dim = -2 if num_rows <= num_cols else -1
    select_dim = normalized if normalized in (-2, -1) and selection_dim == "shard" else shorter_dim
    key = (tuple(shape), shard_dim, select_dim)
    if key in _printed_selection_configs:
        return
    _printed_selection_configs.add(key)
    select_info = "rows" if select_dim == -2 else "columns"
    norm_info = "row norms" if select_dim == -2 else "col norms"
    shorter = "rows" if num_rows <= num_cols else "cols"
    if shard_dim is None:
        mode, reason = "DDP/Single-GPU", f"shorter dim = {shorter} ({min(num_rows, num_cols)})"
    elif normalized in (-2, -1) and select_dim != normalized:
        side = "row" if normalized == -2 else "col"
        mode, reason = "FSDP", (f"{side}-sharded (shard_dim={shard_dim}), shorter dim = {shorter} "
                                f"({min(num_rows, num_cols)}), norms summed across shards")
    elif normalized == -2:
        mode, reason = "FSDP", f"row-sharded (shard_dim={shard_dim}\u2192-2)"
    elif normalized == -1:
        mode, reason = "FSDP", f"col-sharded (shard_dim={shard_dim}\u2192-1)"
    else:
        mode, reason = "FSDP batch-sharded", f"shard_dim={shard_dim} (batch), shorter = {shorter}"
    print(f"[Dion2] Shape {tuple(shape)}: {mode}, {reason} \u2192 "
          f"select top-\u03b1 {select_info} by {norm_info}")


class Dion2(_CppOptimizer):
    """Dion2 (reference: dion/dion2.py). verbose=True prints, once per matrix shape and layout,
    whether rows or columns are selected (as the reference). triton_post_ortho is accepted and
    ignored. selection_dim (dion_cpp's own): on a sharded matrix, select along the dim one
    process would ("shorter", the default: equal to one process) or along the sharded dim as the
    reference does ("shard"); docs/distributed.md."""

    kind = algorithm = "dion2"

    def __init__(self, params: ParamsT, distributed_mesh=None, lr: float = 0.01,
                 fraction: float = 0.25, ef_decay: float = 0.95,
                 betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01,
                 epsilon: float = 1e-8, adjust_lr: Optional[str] = "spectral_norm",
                 flatten: bool = False, use_triton: bool = False, use_polar_express: bool = True,
                 use_gram_newton_schulz: bool = False, newton_schulz_func: Optional[Callable] = None,
                 verbose: bool = False, triton_post_ortho: bool = False,
                 selection_scope: str = "local", selection_dim: str = "shorter"):
        hyper = dict(lr=lr, ef_decay=ef_decay, fraction=float(fraction), betas=betas,
                     weight_decay=weight_decay, epsilon=epsilon, flatten=flatten,
                     adjust_lr=adjust_lr, selection_scope=selection_scope,
                     selection_dim=selection_dim)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func),
                         _group_of(distributed_mesh, "distributed_mesh"))
        self.verbose = verbose

    def step(self, closure: Optional[Callable[[], float]] = None):
        if self.verbose:
            self._report_selection()
        return super().step(closure)

    def _report_selection(self) -> None:
        for group in self.param_groups:
            if group["algorithm"] != "dion2":
                continue
            heads = group.get("num_heads")
            for p in group["params"]:
                if p.grad is None:
                    continue
                if heads is not None and heads > 1:  # per-head matrices, whole on every rank
                    _print_selection_choice((heads, p.shape[0] // heads, *p.shape[1:]), None)
                    continue
                shard_dim = None
                if _is_dtensor(p):
                    dims = [pl.dim % p.dim() for i, pl in enumerate(p.placements)
                            if pl.is_shard() and p.device_mesh.size(i) > 1]
                    shard_dim = dims[0] if dims else None
                _print_selection_choice(tuple(p.shape), shard_dim, group.get("selection_dim", "shorter"))


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
        hyper = dict(lr=lr, fraction=float(fraction), mu=mu, muon_beta2=muon_beta2, betas=betas,
                     weight_decay=weight_decay, epsilon=epsilon, flatten=flatten,
                     adjust_lr=adjust_lr, selection_scope=selection_scope)
        super().__init__(params, hyper, _ortho(use_gram_newton_schulz, use_triton,
                                               use_polar_express, newton_schulz_func),
                         _group_of(distributed_mesh, "distributed_mesh"))


# Dion3 is NorDion2 under its third-generation name: an alias, not a subclass.
Dion3 = NorDion2


class Dion(_CppOptimizer):
    """Legacy Dion: low-rank power iteration (reference: dion/dion.py). 2-D matrices only.
    Meshes as in the reference: replicate_mesh (DDP, or HSDP's replicate dim;
    replicate_mesh_grad_sync: the optimizer averages the gradients, or only its compressed P
    and R), outer_shard_mesh (FSDP) and inner_shard_mesh (TP), the latter two 1-D sub-meshes of
    the DTensor parameters' mesh. A parameter's tensor dim that is Shard over the outer mesh's
    dim is the outer-sharded dim, likewise inner (C++: Distributed(outer, inner).replicate(...),
    shard(local, global_shape, dim, inner_dim)). Not supported: inner sharding without an outer
    shard mesh of more than one rank (NotImplementedError). cqr_warmup_steps is accepted and
    ignored; power_iters must be 1 and qr_method 'rcqr', as in the reference."""

    kind = algorithm = "dion"
    eager_state = False  # the reference creates state (and draws Q) at the first step
    live_hyperparams = False  # the reference's dion.py keeps group["lr"] a float

    def __init__(self, params: ParamsT, replicate_mesh=None, outer_shard_mesh=None,
                 inner_shard_mesh=None, replicate_mesh_grad_sync: bool = True,
                 rank_fraction: float = 1.0, rank_multiple_of: int = 1, lr: float = 0.01,
                 mu: float = 0.95, betas: Tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.01, epsilon: float = 1e-8, power_iters: int = 1,
                 qr_method: str = "rcqr", cqr_warmup_steps: int = 150,
                 rcqr_oversample: float = 1.25,
                 mixed_precision_config: Optional[DionMixedPrecisionConfig] = None):
        replicate = _group_of(replicate_mesh, "replicate_mesh")
        outer = _shard_mesh_group(outer_shard_mesh, "outer_shard_mesh", replicate_mesh)
        inner = _shard_mesh_group(inner_shard_mesh, "inner_shard_mesh", replicate_mesh)
        if inner_shard_mesh is not None and inner_shard_mesh == outer_shard_mesh:
            raise ValueError("Outer and inner shard meshes must be different.")
        if inner is not None and outer is None:
            raise NotImplementedError(
                "inner_shard_mesh with more than one rank needs an outer_shard_mesh of more than one "
                "rank in dion_cpp's legacy Dion (its C++ layouts are FSDP and FSDP x TP)")
        # Sharded (outer, inner, replicate) groups, or None: DDP over replicate_mesh as before.
        self._sharding = (outer, inner, replicate) if outer is not None else None
        self._outer_ranks = dist.get_process_group_ranks(outer) if outer is not None else None
        self._inner_ranks = dist.get_process_group_ranks(inner) if inner is not None else None
        hyper = dict(rank_fraction=rank_fraction, rank_multiple_of=rank_multiple_of, lr=lr, mu=mu,
                     betas=betas, weight_decay=weight_decay, epsilon=epsilon,
                     oversample=rcqr_oversample)
        super().__init__(params, hyper, dict(power_iters=power_iters, qr_method=qr_method,
                                             mixed_precision_config=mixed_precision_config),
                         replicate, replicate_mesh_grad_sync)

    def _distribute(self, group, sync_gradients: bool) -> None:
        if self._sharding is None:
            return super()._distribute(group, sync_gradients)
        outer, inner, replicate = self._sharding

        def ranks(g):
            return dist.get_process_group_ranks(g) if g is not None else []

        self._cpp.set_sharded_distribution(outer, ranks(outer), inner, ranks(inner), replicate,
                                           ranks(replicate), sync_gradients)
        _distributed_optimizers.add(self)

    def _register(self, p: torch.Tensor) -> torch.Tensor:
        """With sharding meshes: find the tensor dims that are Shard over the outer and the inner
        shard mesh's dim of p's mesh (as the reference's _get_dion_param_config) and register
        p's local tensor with them."""
        if self._sharding is None:
            return super()._register(p)
        if not _is_dtensor(p):
            raise TypeError("When using DeviceMesh, all parameters must be DTensor.")
        if any(pl.is_partial() for pl in p.placements):
            raise ValueError(f"DTensor parameter with placements {p.placements}: Partial() "
                             "parameters are not supported (Shard or Replicate only)")
        mesh = p.device_mesh
        outer_dim = inner_dim = None
        seen = set()
        for mesh_dim, placement in enumerate(p.placements):
            if _StridedShard is not None and isinstance(placement, _StridedShard):
                raise NotImplementedError(
                    "StridedShard is not supported. Ensure that FSDP and TP shard different "
                    "dimensions of each matrix.")
            if not placement.is_shard():
                continue
            tensor_dim = placement.dim % p.dim()
            if tensor_dim in seen:
                raise RuntimeError(f"Got double-sharded DTensor for tensor dimension {tensor_dim}.")
            seen.add(tensor_dim)
            mesh_dim_ranks = dist.get_process_group_ranks(mesh.get_group(mesh_dim))
            is_outer = mesh_dim_ranks == self._outer_ranks
            is_inner = mesh_dim_ranks == self._inner_ranks
            if is_outer and is_inner:
                raise RuntimeError(
                    "Cannot have outer and inner sharding over the same process group.")
            if mesh.size(mesh_dim) > 1 and not is_outer and not is_inner:
                raise RuntimeError(
                    f"Got DTensor sharded on unrecognized mesh_dim={mesh_dim}, which does not "
                    "match outer_shard_mesh or inner_shard_mesh.")
            if is_outer:
                outer_dim = tensor_dim
            if is_inner:
                inner_dim = tensor_dim
        if inner_dim is not None and outer_dim is None:
            raise NotImplementedError(
                f"DTensor parameter with placements {p.placements}: sharded over inner_shard_mesh "
                "only; dion_cpp's legacy Dion needs the outer_shard_mesh sharding too (FSDP x TP)")
        local = self._local_of(p)
        if outer_dim is not None:
            self._cpp.shard(local, list(p.shape), outer_dim, -1 if inner_dim is None else inner_dim)
        return local

    def synchronize_for_checkpoint(self) -> None:
        """Average the state over replicate_mesh before saving a checkpoint (with
        replicate_mesh_grad_sync the momenta drift apart across replicas); else a no-op."""
        self._cpp.synchronize_for_checkpoint()
