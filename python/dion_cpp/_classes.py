"""The optimizer classes of dion_cpp, generated from the C++ algorithm registry.

Each registered matrix algorithm (dion/optim/algorithm.h) becomes a class here: a _CppOptimizer
(_optimizers.py) whose constructor has the keywords of its entry in _class_table.py (the
reference's, in its order and with its defaults) and the behaviours the entry asks for (a
ClassEntry's flags: meshes, selection_report, lazy_state, float_hyperparams). An algorithm with no
entry (a plugin's) gets _class_table.default_entry.

classes() is every generated class by name (class aliases included); load_algorithm_plugin adds
the classes of a plugin's algorithms.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.distributed as dist

from . import _C
from ._dist import (_DTensor, _StridedShard, _distributed_optimizers, _group_of, _is_dtensor,
                    _shard_mesh_group)
from ._class_table import CLASSES, ClassEntry, Target, default_entry
from ._optimizers import _CppOptimizer


@dataclass
class DionMixedPrecisionConfig:
    """State dtypes for Dion (None: the parameter's dtype), as the reference's class."""

    momentum_dtype: Optional[torch.dtype] = None
    Q_dtype: Optional[torch.dtype] = None
    variance_dtype: Optional[torch.dtype] = None



# ---------------------------------------------------------------------------- behaviours
# Dion2's verbose report, printed once per (shape, shard dim, selection dim) in the process, as
# the reference's _print_selection_choice (dion/dion2.py).
_printed_selection_configs: set = set()


def _print_selection_choice(shape, shard_dim: Optional[int], selection_dim: str = "shard",
                            label: str = "Dion2") -> None:
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
    print(f"[{label}] Shape {tuple(shape)}: {mode}, {reason} \u2192 "
          f"select top-\u03b1 {select_info} by {norm_info}")


class _SelectionReport:
    """verbose=True: print, once per matrix shape and layout, whether rows or columns are
    selected (as the reference)."""

    verbose: bool = False

    def step(self, closure: Optional[Callable[[], float]] = None):
        if self.verbose:
            self._report_selection()
        return super().step(closure)

    def _report_selection(self) -> None:
        for group in self.param_groups:
            if group["algorithm"] != self.algorithm:
                continue
            heads = group.get("num_heads")
            for p in group["params"]:
                if p.grad is None:
                    continue
                if heads is not None and heads > 1:  # per-head matrices, whole on every rank
                    _print_selection_choice((heads, p.shape[0] // heads, *p.shape[1:]), None,
                                            label=type(self).__name__)
                    continue
                shard_dim = None
                if _is_dtensor(p):
                    dims = [pl.dim % p.dim() for i, pl in enumerate(p.placements)
                            if pl.is_shard() and p.device_mesh.size(i) > 1]
                    shard_dim = dims[0] if dims else None
                _print_selection_choice(tuple(p.shape), shard_dim, group.get("selection_dim", "shorter"),
                                        type(self).__name__)


class _ShardMeshes:
    """The reference's replicate_mesh / outer_shard_mesh / inner_shard_mesh: DTensor parameters
    on a mesh whose dims are those 1-D sub-meshes are registered with their outer- (FSDP) and
    inner- (TP) sharded tensor dims; replicate_mesh adds HSDP's replicas."""

    def _resolve_meshes(self, replicate_mesh, outer_shard_mesh, inner_shard_mesh):
        """The ProcessGroup to replicate over (None: none); sets the sharding groups."""
        replicate = _group_of(replicate_mesh, "replicate_mesh")
        outer = _shard_mesh_group(outer_shard_mesh, "outer_shard_mesh", replicate_mesh)
        inner = _shard_mesh_group(inner_shard_mesh, "inner_shard_mesh", replicate_mesh)
        if inner_shard_mesh is not None and inner_shard_mesh == outer_shard_mesh:
            raise ValueError("Outer and inner shard meshes must be different.")
        if inner is not None and outer is None:
            raise NotImplementedError(
                "inner_shard_mesh with more than one rank needs an outer_shard_mesh of more than one "
                f"rank in dion_cpp's {type(self).__name__} (its C++ layouts are FSDP and FSDP x TP)")
        # Sharded (outer, inner, replicate) groups, or None: DDP over replicate_mesh.
        self._sharding = (outer, inner, replicate) if outer is not None else None
        self._outer_ranks = dist.get_process_group_ranks(outer) if outer is not None else None
        self._inner_ranks = dist.get_process_group_ranks(inner) if inner is not None else None
        return replicate

    def _plan_layouts(self, param_groups: list, group):
        """With sharding meshes their groups are the layouts' (_register); else as the base."""
        if self._sharding is None:
            return super()._plan_layouts(param_groups, group)
        self._plan = None
        return group

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
                local = self._local_of(p)
                if self._register_expert(p, local):  # an expert stack on its EP mesh
                    return local
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
                "only; dion_cpp needs the outer_shard_mesh sharding too (FSDP x TP)")
        local = self._local_of(p)
        if outer_dim is not None:
            self._cpp.shard(local, list(p.shape), outer_dim, -1 if inner_dim is None else inner_dim)
        return local

    def synchronize_for_checkpoint(self) -> None:
        """Average the state over replicate_mesh before saving a checkpoint (with
        replicate_mesh_grad_sync the momenta drift apart across replicas); else a no-op."""
        self._cpp.synchronize_for_checkpoint()


# ---------------------------------------------------------------------------- generation

def _make_class(algorithm: str, entry: ClassEntry) -> type:
    """The class of one registered algorithm from its entry."""
    keywords = entry.keywords
    defaults = {k.name: ast.literal_eval(k.default) for k in keywords}
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("params", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(k.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[k.name])
               for k in keywords]
    signature = inspect.Signature(params)
    class_name = entry.name

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        hyper, extra, mesh, attributes = {}, {}, {}, {}
        for k in keywords:
            value = given[k.name]
            if k.target is Target.OPTION:
                hyper[k.option or k.name] = value
            elif k.target is Target.FLOAT:
                hyper[k.option or k.name] = float(value)
            elif k.target is Target.EXTRA:
                extra[k.name] = value
            elif k.target is Target.MESH:
                mesh[k.name] = value
            elif k.target is Target.ATTRIBUTE:
                attributes[k.name] = value
            elif k.target is Target.FIXED and value != defaults[k.name]:
                raise ValueError(f"{class_name} supports {k.name}={k.default} only, got {value!r}")
        sync_gradients = False
        if entry.meshes:
            group = self._resolve_meshes(mesh.get("replicate_mesh"), mesh.get("outer_shard_mesh"),
                                         mesh.get("inner_shard_mesh"))
            sync_gradients = bool(mesh.get("replicate_mesh_grad_sync", False))
        else:
            group = mesh.get("distributed_mesh")  # resolved with the parameters' placements
        _CppOptimizer.__init__(self, given["params"], hyper, extra, group, sync_gradients)
        for name, value in attributes.items():
            setattr(self, name, value)

    __init__.__signature__ = signature
    __init__.__doc__ = entry.doc
    bases = ((_ShardMeshes,) if entry.meshes else ()) + ((_SelectionReport,) if entry.selection_report else ())
    namespace = {
        "__init__": __init__,
        "__doc__": entry.doc,
        "__module__": "dion_cpp",
        "kind": algorithm,
        "algorithm": algorithm,
        "eager_state": not entry.lazy_state,
        "live_hyperparams": not entry.float_hyperparams,
    }
    return type(class_name, bases + (_CppOptimizer,), namespace)


_classes: Dict[str, type] = {}


def _generate() -> Dict[str, type]:
    """Classes for every registered algorithm that has none yet (by class name, aliases too)."""
    added = {}
    for info in _C.algorithms():
        if not info["matrix"]:
            continue
        entry = CLASSES.get(info["name"]) or default_entry(info)
        if entry.name in _classes:
            continue
        cls = _make_class(info["name"], entry)
        added[entry.name] = cls
        for alias in entry.aliases:  # the same class under another name
            added[alias] = cls
    _classes.update(added)
    return added


def classes() -> Dict[str, type]:
    """Every generated class, by name (class aliases included)."""
    return dict(_classes)


def load_algorithm_plugin(path: str) -> Dict[str, type]:
    """Load a shared library of algorithms (dion/optim/algorithm.h, DION_ALGORITHM_PLUGIN) into
    the C++ registry and return the classes generated for them (also in dion_cpp.classes() and
    as attributes of dion_cpp)."""
    _C.load_algorithm_plugin(str(path))
    added = _generate()
    import dion_cpp  # the package: its attributes are the classes
    for name, cls in added.items():
        setattr(dion_cpp, name, cls)
    return added


_generate()
globals().update(_classes)
