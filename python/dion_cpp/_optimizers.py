"""The base of dion_cpp's optimizer classes: a thin torch.optim.Optimizer shell over the C++ library.

What it is: one base class, `_CppOptimizer`, that keeps a C++ dion optimizer (dion_cpp._C)
over the same parameter tensors. The public classes (the reference's, with its constructor
signatures and defaults) are generated from the C++ algorithm registry in _classes.py; state
dicts are _state_dict.py's, the distributed helpers _dist.py's. Every step:
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
(each algorithm's own: momentum, variance, variance_neuron, Q, step_dev); load_state_dict writes into the C++ state,
all or nothing (checked first, rolled back on a later failure). As in the reference,
group["lr"] of the DistributedOrthoBase family is a persistent 0-d float32 tensor (so LR
schedulers compute exactly as there); state_dict() writes it as a number. Copies and pickles
of an optimizer are refused (TypeError): the state lives in C++.

Distributed (the reference's conventions, megabatch_base.py, extended to torchtitan's meshes):
`distributed_mesh` is a torch.distributed ProcessGroup (DDP: parameters replicated, gradients
already averaged), a 1-D DeviceMesh (its group), an N-D DeviceMesh or sub-mesh, or omitted.
DTensor parameters (FSDP2 fully_shard, distribute_tensor) are read first (_layouts.py): their
placements choose each one's layout — FSDP over one mesh dim (HSDP's Replicate() dims ignored),
FSDP x TP over two (the outer and inner groups), expert stacks over their EP mesh or, with
torchtitan's EP x FSDP placements (_StridedShard(0), Shard(0)), over the flattened 2-D mesh
(shard_over: whole experts where they are), or with (Shard(1), Shard(0)) each EP rank's experts
split on their rows over the efsdp group — and, unless distributed_mesh fixes it, the outer
group; Partial and the layouts C++ cannot run are refused there, on every rank, before any
collective. The C++ optimizer works on their local tensors (`_local_tensor`, the same storage),
registered with the global shape and dims, and receives their local gradients before each step.
The C++ step then runs its DDP / FSDP layouts (docs/distributed.md) over the group's own backends
(Gloo for CPU tensors, NCCL for CUDA tensors), from the thread that calls step().
State tensors of DTensor parameters are handed back as DTensors over the same local storage.
describe() lists each parameter's layout and how it is orthogonalized.
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

from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist
from torch.optim.optimizer import Optimizer, ParamsT

from . import _C
from . import _checks
from . import _layouts
from ._dist import _DTensor, _StridedShard, _distributed_optimizers, _group_of, _is_dtensor
from ._state_dict import _StateDict


class _CppOptimizer(_StateDict, Optimizer):
    """Base class. `kind` names the C++ class and `algorithm` its matrix algorithm;
    `eager_state` mirrors the reference, whose DistributedOrthoBase family creates every
    parameter's state at construction while legacy Dion creates it at the first step."""

    kind: str = "any"
    algorithm: str = ""  # set by each generated class (_classes.py)
    eager_state: bool = True
    # The reference's DistributedOrthoBase family carries group["lr"] (and a Tensor
    # weight_decay) as a persistent 0-d float32 tensor on the parameters' device; legacy Dion
    # keeps plain floats. A scheduler then computes in float32 exactly as it does there.
    live_hyperparams: bool = True

    def __init__(self, params: ParamsT, hyper: dict, extra: dict, group=None,
                 sync_gradients: bool = False):
        # C++ first: it validates the constructor's hyperparameters (betas included) and then
        # receives every group through add_param_group, which Optimizer.__init__ calls.
        # `group`: distributed_mesh (None, a ProcessGroup, a 1-D or N-D DeviceMesh), or the
        # ProcessGroup to distribute over (legacy Dion's replicate mesh). The DTensor parameters'
        # placements are read first (_layouts): they choose the outer / inner groups when
        # distributed_mesh does not, and what is not supported is refused before any collective.
        self._ctor_kwargs = {**hyper, **extra}  # a rebuild after param_groups edits needs them
        self._cpp = _C.Optimizer(self.kind, self._ctor_kwargs)
        params = _materialize(params)
        group = self._plan_layouts(params, group)
        self._group = group
        self._registered = []  # (group dict, its parameters) as C++ holds them (_sync_structure)
        # The cross-rank check of step() (_checks.ReplicaCheck): None = automatic (over the
        # distributed_mesh / replicate and shard meshes given, else over the default group when
        # torch.distributed is initialized with more than one rank), False = off, or a
        # ProcessGroup to check over. replica_check_timeout: seconds to wait for the other ranks.
        self.replica_check = None
        self.replica_check_timeout = _checks.DEFAULT_TIMEOUT_S
        self._local = {}  # DTensor parameter -> its local tensor (what C++ holds)
        self._expert_groups = []  # ProcessGroups of expert stacks (_register_expert), per stack
        self._distribute(group, sync_gradients)
        hyper = dict(hyper)
        beta1, beta2 = hyper.pop("betas", (0.9, 0.95))  # the table's default for classes without it
        defaults = dict(hyper, beta1=beta1, beta2=beta2, algorithm=self.algorithm, step=0)
        self._hyperparam_tensors = {}  # (group index, name) -> persistent 0-d float32 tensor
        self._live_hyperparams_by_group = {}
        super().__init__(params, defaults)
        if self.eager_state:
            self.init_state()
        self._sync_hyperparam_tensors()

    def _plan_layouts(self, param_groups: list, mesh):
        """Read every DTensor parameter's placements (_layouts.classify: refusals first, no
        collective), choose the outer and inner groups (_layouts.Plan) and return the outer
        ProcessGroup (None: nothing to distribute over)."""
        owner = type(self).__name__
        fixed = nd_mesh = None
        if _layouts.is_mesh(mesh) and mesh.ndim > 1:
            nd_mesh = mesh
        else:
            group = _group_of(mesh, "distributed_mesh")
            if group is not None:
                fixed = _layouts.group_axis(group, f"distributed_mesh's group ({dist.get_world_size(group)} ranks)")
        self._plan = _layouts.Plan(owner, fixed, nd_mesh)
        found = []
        for g, group_dict in enumerate(param_groups if isinstance(param_groups, list) else []):
            if not isinstance(group_dict, dict) or "params" not in group_dict:
                continue  # Optimizer.__init__ raises its error
            for j, (name, p) in enumerate(_named(group_dict["params"])):
                if _is_dtensor(p) and all(p is not q for q, _ in found):
                    where = f"param group {g}, parameter {j}" + (f" '{name}'" if name else "")
                    found.append((p, _layouts.classify(p, where, owner)))
        self._plan.add(found)
        self._plan.frozen = True
        outer = self._plan.outer
        if outer is None and nd_mesh is not None and nd_mesh.size() > 1:
            outer = _layouts.whole_mesh_axis(nd_mesh)  # DDP over every rank of the mesh
            self._plan.outer = outer
        return outer.group if outer is not None else None

    def _distribute(self, group, sync_gradients: bool) -> None:
        """Give the C++ optimizer its distribution (DDP / FSDP over `group`, FSDP x TP with the
        parameters' inner group), if any."""
        if group is None:
            return
        inner = self._plan.inner if getattr(self, "_plan", None) is not None else None
        ranks = dist.get_process_group_ranks(group)
        if inner is not None:
            self._cpp.set_sharded_distribution(group, ranks, inner.group, list(inner.ranks), None, [],
                                               sync_gradients)
        else:
            self._cpp.set_distribution(group, ranks, sync_gradients)
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
        return (self._group is not None or getattr(self, "_sharding", None) is not None
                or bool(self._expert_groups))

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
            inner = self._plan.inner if getattr(self, "_plan", None) is not None else None
            if inner is not None:
                groups.append(inner.group)
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
        """The tensor C++ holds for `p`: p itself, or a DTensor's local tensor, registered with
        the layout its placements map to (_layouts: FSDP over the outer group, FSDP x TP over
        outer and inner, an expert stack over its own group; replicated otherwise)."""
        if not _is_dtensor(p):
            return p
        layout = self._plan.layouts.get(p)
        if layout is None:  # added after construction: the groups cannot change any more
            where = f"parameter of param group {len(self.param_groups) - 1}"
            layout = _layouts.classify(p, where, type(self).__name__)
            self._plan.add([(p, layout)])
        local = p._local_tensor  # the storage the DTensor reads (to_local() may return a view)
        shape = list(p.shape)
        if layout.kind == _layouts.SHARD or (layout.kind == _layouts.BATCH and layout.on_outer):
            self._cpp.shard(local, shape, layout.dim)
        elif layout.kind == _layouts.TWO_D:
            dims = (layout.inner_dim, layout.dim) if layout.swapped else (layout.dim, layout.inner_dim)
            self._cpp.shard(local, shape, *dims)
        elif layout.kind == _layouts.BATCH:
            self._shard_over(layout.axis, local, shape, layout.dim)
        elif layout.kind == _layouts.EXPERTS:
            self._shard_over(_layouts.experts_axis(layout), local, shape, 0)
        elif layout.kind == _layouts.EXPERT_SHARDS:  # this rank's experts, split on a matrix dim
            shape[layout.inner_dim] = local.shape[layout.inner_dim]
            self._shard_over(layout.axis, local, shape, layout.dim)
        elif layout.kind == _layouts.SPLIT_TWICE:  # members in chunk order
            axis, order = _layouts.split_twice_axis(layout)
            self._shard_over(axis, local, shape, layout.dim, order)
        self._local[p] = local
        return local

    def _shard_over(self, axis, local: torch.Tensor, shape, dim: int, order=None) -> None:
        """A parameter split over a group of its own (C++ Distribution::shard_over): an expert
        stack, or a matrix dim over two mesh dims (`order`: the members in chunk order)."""
        self._cpp.shard_over(axis.group, list(axis.ranks), local, shape, dim, list(order or []))
        self._expert_groups.append(axis.group)
        _distributed_optimizers.add(self)

    def _register_expert(self, p: torch.Tensor, local: torch.Tensor) -> bool:
        """torchtitan's expert parallelism: a 3-D+ DTensor [E, ...] placed Shard(0) on a 1-D
        mesh of more than one rank (the EP mesh) that is not one of the optimizer's meshes is an
        expert stack split over that mesh's group (C++ Distribution::shard_over): its matrices
        are whole on every rank and orthogonalized where they are. False: not one."""
        mesh = p.device_mesh
        if (p.dim() < 3 or mesh.ndim != 1 or mesh.size() < 2 or not p.placements[0].is_shard()
                or p.placements[0].dim % p.dim() != 0
                or (_StridedShard is not None and isinstance(p.placements[0], _StridedShard))):
            return False
        group = mesh.get_group()
        if group in [g for g in (self._group, *(getattr(self, "_sharding", None) or ())) if g is not None]:
            return False  # sharded over one of the optimizer's own meshes: not an expert stack
        self._shard_over(_layouts.group_axis(group, "the EP mesh"), local, list(p.shape), 0)
        return True

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
            if _layouts._splits(pl):
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


    # ------------------------------------------------------------------ describe
    def describe(self, named_parameters=None) -> "_layouts.Description":
        """One row per parameter: its name, param group, algorithm, global and local shape, its
        placements, the layout the C++ optimizer gives it and how it is orthogonalized (whole,
        batched over a stack's matrices or experts, per head, split, flattened; Dion2's selection;
        element-wise for scalar algorithms): a list of dicts that prints as a table.
        `named_parameters`: a {name: parameter} mapping or (name, parameter) pairs (e.g.
        model.named_parameters()) to name the rows; else torch's param_names when the optimizer
        was given named parameters, else param_groups[g][j]. Not collective."""
        names = {}
        if named_parameters is not None:
            pairs = named_parameters.items() if isinstance(named_parameters, dict) else named_parameters
            names = {id(p): name for name, p in pairs}
        plan = getattr(self, "_plan", None)
        rows = []
        for g, group in enumerate(self.param_groups):
            given = group.get("param_names") or []
            for j, p in enumerate(group["params"]):
                name = names.get(id(p)) or (given[j] if j < len(given) else f"param_groups[{g}][{j}]")
                layout = plan.layouts.get(p) if plan is not None and _is_dtensor(p) else None
                rows.append(_layouts.describe_row(self, name, g, group, p, layout))
        return _layouts.Description(rows)

    # ------------------------------------------------------------------ copies
    def __getstate__(self):
        # torch.optim's copy / pickle support would copy the Python shell without the C++
        # optimizer (whose state and distribution are not Python objects): refuse at copy time.
        raise TypeError(
            f"a dion_cpp {type(self).__name__} cannot be copied or pickled (copy.deepcopy, pickle, "
            "torch.save(optimizer)): its state lives in the C++ library. Save "
            "optimizer.state_dict() instead and load it into a new optimizer with load_state_dict()")



def _materialize(params) -> list:
    """The param groups as torch.optim.Optimizer.__init__ reads them (a list of dicts whose
    "params" are lists), so that they can be read twice: first for their placements."""
    if isinstance(params, torch.Tensor):
        return params  # Optimizer.__init__ raises its TypeError
    groups = list(params)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    for g in groups:
        if isinstance(g, dict) and "params" in g and not isinstance(g["params"], (list, torch.Tensor, set)):
            g["params"] = list(g["params"])
    return groups


def _named(params):
    """(name or None, tensor) of a group's "params" (tensors, or torch's (name, tensor) pairs)."""
    if isinstance(params, torch.Tensor):
        params = [params]
    for p in params:
        if isinstance(p, tuple) and len(p) == 2:
            yield p[0], p[1]
        else:
            yield None, p
