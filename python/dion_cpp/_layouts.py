"""DTensor placements as the C++ optimizer's layouts: which group a parameter is sharded over.

What it is: the mapping from each DTensor parameter's (device mesh, placements) to one of the C++
Distribution's layouts (include/dion/optim/distribution.h), and the choice of the Distribution's
OUTER (FSDP) and INNER (TP) groups from the parameters, for the DistributedOrthoBase family
(the matrix algorithms but legacy Dion, whose shard meshes are _classes._ShardMeshes).
Mesh dims of one rank and Replicate() dims are ignored (HSDP's replicate dim: FSDP2 has already
averaged the gradients over it). What remains is one of:
  LOCAL    nothing sharded: the local tensor is the whole parameter (replicated: DDP over the
           outer group when there is one, else one process's work);
  SHARD    one mesh dim shards a tensor dim (a matrix dim, or a vector): FSDP over that mesh dim's
           group, which must be the OUTER group (Distribution::shard);
  TWO_D    two mesh dims shard the two matrix dims (FSDP x TP): one is the OUTER group, the other
           the INNER group (Distribution::shard(local, shape, dim, inner_dim));
  BATCH    one mesh dim shards a batch dim of a 3-D+ stack (an expert stack [E, out, in] on an EP
           mesh): whole matrices on every rank; Distribution::shard over the OUTER group when it
           is that mesh dim's ProcessGroup, else shard_over that group (expert parallelism);
  EXPERTS  an expert stack split on dim 0 over two mesh dims: torchtitan's EP x FSDP,
           (_StridedShard(0, sf=ep), Shard(0)) on ("efsdp", "ep") (or (Shard(0), Shard(0))):
           whole experts on every rank, shard_over the group of every rank of those two mesh dims
           (the flattened mesh). The C++ check of a shard_over chunk compares its length with
           FSDP2's contiguous chunk of ceil(E / world); strided sharding places chunk e * F + f on
           the rank at (f, e), which is not that group's rank order, so equal chunks are required
           (E divisible by the ranks): then every length matches whatever the order, and nothing
           else in the C++ step depends on which experts a rank holds (they are orthogonalized
           where they are; no collective but the one-time check).
  EXPERT_SHARDS  an expert stack with its experts (dim 0) split over one mesh dim and a matrix
           dim over another: torchtitan's EP x FSDP with shard_placement_fn Shard(1),
           (Shard(1), Shard(0)) on ("efsdp", "ep"). This EP rank's experts are registered as a
           stack of their own ([E / ep, out, in]; equal on every rank: E divisible by ep) split on
           the matrix dim over the other mesh dim's group (shard_over; the C++ step assembles
           them over that group as FSDP shards over the outer one).
  SPLIT_TWICE  a matrix dim split over two mesh dims: FSDP2 over TP on the same dim (torchtitan's
           column-parallel weights under FSDP x TP, (_StridedShard(0, sf=tp), Shard(0)) on
           ("fsdp", "tp")), or nested Shard(d)s; equal chunks (the dim divisible by the ranks).
           shard_over every rank of the two mesh dims with the members in chunk order (the
           bindings' OrderedAxis): the assembly concatenates chunks in group-rank order.
Anything else (Partial, a _StridedShard of another pattern, a dim split unevenly where equal
chunks are needed, three sharded mesh dims) is refused here, with the
parameter's shape, its placements and what works, before any collective: every rank sees the
same placements and so raises the same error.

The groups: distributed_mesh given as a ProcessGroup or a 1-D DeviceMesh fixes the OUTER group (as
before: the reference's convention); an N-D DeviceMesh (or sub-mesh), or none, leaves it to the
parameters: the group of the SHARD parameters' mesh dim, else the first mesh dim of the first
TWO_D parameter; the INNER group is the TWO_D parameters' other mesh dim. Parameters that need
different OUTER (or INNER) groups are refused, naming both. With an N-D distributed_mesh those
groups must be dims of it; when no parameter is sharded, the whole mesh is the DDP group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._dist import _DeviceMesh, _StridedShard, _is_dtensor

LOCAL, SHARD, TWO_D, BATCH, EXPERTS, EXPERT_SHARDS, SPLIT_TWICE = (
    "local", "shard", "2-D", "batch", "experts", "expert shards", "split twice")

WHAT_WORKS = (
    "what works: Replicate() on any mesh dim; Shard(d) over one mesh dim (FSDP; HSDP's "
    "(Replicate(), Shard(d))); Shard on the two matrix dims over two mesh dims (FSDP x TP: "
    "(Shard(0), Shard(1)) or (Shard(1), Shard(0))); an expert stack [E, out, in] Shard(0) over an EP "
    "mesh, split on dim 0 over two mesh dims ((_StridedShard(0, sf=ep), Shard(0)): torchtitan's "
    "EP x FSDP with fully_shard(..., shard_placement_fn=lambda p: Shard(0))), or on dim 0 over one and "
    "a matrix dim over the other ((Shard(1), Shard(0)): shard_placement_fn Shard(1)); a matrix dim over two "
    "mesh dims in equal chunks (FSDP over TP: (_StridedShard(0, sf=tp), Shard(0))); docs/distributed.md")


def _is_strided(pl) -> bool:
    return _StridedShard is not None and isinstance(pl, _StridedShard)


def _splits(pl) -> bool:
    """Whether placement `pl` splits a tensor dim (Shard, or torch 2.11's _StridedShard, which is
    not a Shard and whose is_shard() is False)."""
    return pl.is_shard() or _is_strided(pl)


def mesh_str(mesh) -> str:
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return "DeviceMesh(" + ", ".join(f"{n}={s}" for n, s in zip(names, mesh.shape)) + ")"


def placements_str(placements) -> str:
    return "(" + ", ".join(repr(pl) for pl in placements) + ")"


@dataclass(eq=False)
class Axis:
    """A group the C++ optimizer can shard over: a mesh dim's ProcessGroup, or the group of a
    whole (flattened) mesh. Two axes are the same when they have the same members."""
    group: object
    ranks: Tuple[int, ...]
    label: str

    def same(self, other: Optional["Axis"]) -> bool:
        return other is not None and self.ranks == other.ranks


def mesh_dim_axis(mesh, i: int) -> Axis:
    group = mesh.get_group(i)
    name = mesh.mesh_dim_names[i] if mesh.mesh_dim_names else f"dim {i}"
    return Axis(group, tuple(dist.get_process_group_ranks(group)),
                f"mesh dim '{name}' ({mesh.size(i)} ranks) of {mesh_str(mesh)}")


def group_axis(group, label: str) -> Axis:
    return Axis(group, tuple(dist.get_process_group_ranks(group)), label)


def whole_mesh_axis(mesh) -> Axis:
    """The group of every rank of `mesh` (its own group when 1-D; else the flattened mesh's,
    DeviceMesh._flatten: collective over the mesh's root, once per mesh, cached by torch)."""
    if mesh.ndim == 1:
        return mesh_dim_axis(mesh, 0)
    if mesh.mesh_dim_names is None:
        if mesh.size() == dist.get_world_size():
            return group_axis(dist.group.WORLD, f"every rank of {mesh_str(mesh)} (the default group)")
        raise ValueError(
            f"{mesh_str(mesh)}: dion_cpp needs the group of every rank of this mesh, which it builds "
            "with DeviceMesh._flatten: give the mesh dim names (init_device_mesh(..., mesh_dim_names=...))")
    flat = mesh._flatten()
    group = flat.get_group()
    return Axis(group, tuple(dist.get_process_group_ranks(group)),
                f"every rank of {mesh_str(mesh)} ({mesh.size()} ranks, flattened)")


def _two_dims(L: "ParamLayout"):
    """The 2-D (sub)mesh of the two mesh dims that split L's parameter."""
    mesh = L.mesh
    if mesh.ndim > 2:
        if mesh.mesh_dim_names is None:
            raise ValueError(f"{L.desc}: dion_cpp slices the parameter's two mesh dims out of "
                             f"{mesh_str(mesh)} by name: give the mesh dim names")
        mesh = mesh[tuple(mesh.mesh_dim_names[i] for i in L.mesh_dims)]
    return mesh


def experts_axis(L: "ParamLayout") -> Axis:
    """The group of an EXPERTS stack: every rank of its two mesh dims (the flattened sub-mesh)."""
    return whole_mesh_axis(_two_dims(L))


def split_twice_axis(L: "ParamLayout") -> Tuple[Axis, List[int]]:
    """The group of a SPLIT_TWICE parameter (every rank of its two mesh dims) and its members
    (global ranks) in the order of the chunks they hold: strided (FSDP2 over TP), the rank at
    (f, t) holds chunk t * F + f; nested Shard(d)s, chunk f * T + t."""
    mesh = _two_dims(L)
    grid = mesh.mesh
    n_i, n_j = grid.shape
    if L.strided:
        order = [int(grid[c % n_i, c // n_i]) for c in range(n_i * n_j)]
    else:
        order = [int(grid[c // n_j, c % n_j]) for c in range(n_i * n_j)]
    return whole_mesh_axis(mesh), order


@dataclass(eq=False)
class ParamLayout:
    """How one parameter is registered (see the module's docstring)."""
    kind: str
    desc: str                        # "parameter 3 of param group 0, shape [...], placements ..."
    dim: int = -1                    # the tensor dim split over `axis`
    axis: Optional[Axis] = None
    inner_dim: int = -1              # TWO_D: the tensor dim split over `inner_axis`
    inner_axis: Optional[Axis] = None
    mesh: object = None              # EXPERTS: the mesh whose every rank the stack is split over
    mesh_dims: Tuple[int, ...] = ()  # the mesh dims that split it
    placement: str = ""              # "Shard(0) over 'fsdp'": the describe() column
    # Resolved (Plan.add): SHARD / TWO_D register over the outer (inner) group; BATCH over the
    # outer group when it is that group (`on_outer`), else shard_over.
    swapped: bool = False            # TWO_D: `inner_axis` is the outer group
    strided: bool = False            # SPLIT_TWICE: FSDP2 over TP (chunk t * F + f)
    on_outer: bool = False


def describe_param(p: torch.Tensor, where: str) -> str:
    text = f"{where}: shape {list(p.shape)}"
    if _is_dtensor(p):
        text += (f" (local {list(p._local_tensor.shape)}), placements {placements_str(p.placements)} "
                 f"on {mesh_str(p.device_mesh)}")
    return text


def _axis_names(mesh, dims) -> str:
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return " x ".join(f"'{names[i]}'" for i in dims)


def classify(p: torch.Tensor, where: str, owner: str) -> ParamLayout:
    """The layout of DTensor parameter `p` (no collective). Raises for what is not supported."""
    desc = describe_param(p, where)
    mesh, placements, nd = p.device_mesh, tuple(p.placements), p.dim()
    for pl in placements:
        if pl.is_partial():
            raise ValueError(
                f"{owner}: {desc}: Partial() parameters are not supported (a parameter must hold "
                f"values, not partial sums: redistribute it to Replicate() or Shard); {WHAT_WORKS}")
        if not (pl.is_replicate() or _splits(pl)):
            raise NotImplementedError(f"{owner}: {desc}: placement {pl!r} is not supported; {WHAT_WORKS}")
    split = [(i, pl) for i, pl in enumerate(placements) if _splits(pl) and mesh.size(i) > 1]
    # A _StridedShard whose split factor is 1 (the mesh dim after it has one rank) is a Shard.
    strided = [i for i, pl in split if _is_strided(pl) and pl.split_factor != 1]

    def refuse(why: str, error=NotImplementedError):
        raise error(f"{owner}: {desc}: {why}; {WHAT_WORKS}")

    if not split:
        return ParamLayout(LOCAL, desc, placement="replicated" if _is_dtensor(p) else "")
    if len(split) == 1:
        (i, pl), = split
        if strided:
            refuse(f"a {pl!r} over mesh dim {_axis_names(mesh, [i])} alone is not supported")
        d = pl.dim % nd
        kind = BATCH if nd >= 3 and d < nd - 2 else SHARD
        return ParamLayout(kind, desc, dim=d, axis=mesh_dim_axis(mesh, i), mesh_dims=(i,),
                           placement=f"Shard({d}) over {_axis_names(mesh, [i])}")
    if len(split) > 2:
        refuse(f"sharded over {len(split)} mesh dims ({_axis_names(mesh, [i for i, _ in split])}); "
               "at most two are supported")
    (i, a), (j, b) = split
    da, db = a.dim % nd, b.dim % nd
    if da == db == 0 and nd >= 3 and not _is_strided(b) and (
            not _is_strided(a) or a.split_factor in (1, mesh.size(j))):
        # An expert stack split on dim 0 over both mesh dims: EP x FSDP (torchtitan's
        # (_StridedShard(0, sf=ep), Shard(0))), or nested plain Shard(0)s.
        ranks = mesh.size(i) * mesh.size(j)
        if p.shape[0] % ranks != 0:
            refuse(f"its {p.shape[0]} experts (dim 0) are split over {ranks} ranks "
                   f"({_axis_names(mesh, [i, j])}) unevenly; dion_cpp needs an equal number of whole "
                   f"experts on every rank (dim 0 divisible by {ranks})")
        return ParamLayout(EXPERTS, desc, dim=0, mesh=mesh, mesh_dims=(i, j),
                           placement=f"experts over {_axis_names(mesh, [i, j])}")
    if da == db and da >= nd - 2 and not _is_strided(b) and (
            not _is_strided(a) or a.split_factor in (1, mesh.size(j))):
        # One matrix dim split over two mesh dims: FSDP2 over TP on the same dim (torchtitan's
        # column-parallel weights: (_StridedShard(0, sf=tp), Shard(0)) on ("fsdp", "tp"): the rank
        # at (f, t) holds chunk t * F + f), or nested Shard(d)s (chunk f * T + t). Registered over
        # every rank of the two mesh dims, the members in chunk order (shard_over with `order`).
        ranks = mesh.size(i) * mesh.size(j)
        if p.shape[da] % ranks != 0:
            refuse(f"its dim {da} ({p.shape[da]}) is split over {ranks} ranks ({_axis_names(mesh, [i, j])}) "
                   f"unevenly; dion_cpp needs equal chunks there (dim {da} divisible by {ranks})")
        L = ParamLayout(SPLIT_TWICE, desc, dim=da, mesh=mesh, mesh_dims=(i, j),
                        placement=f"Shard({da}) over {_axis_names(mesh, [i, j])}"
                                  + (" (FSDP over TP: strided)" if _is_strided(a) and a.split_factor != 1 else ""))
        L.strided = _is_strided(a) and a.split_factor != 1  # the chunk order: t * F + f
        return L
    if strided:
        refuse(f"this _StridedShard pattern over {_axis_names(mesh, [i, j])} is not supported")
    if da == db:
        refuse(f"tensor dim {da} is sharded over two mesh dims ({_axis_names(mesh, [i, j])}); shard the "
               "two matrix dims (FSDP x TP) or, for an expert stack, dim 0 over both")
    if {da, db} != {nd - 2, nd - 1}:
        (b, db_), (m, dm) = ((i, da), (j, db)) if da < db else ((j, db), (i, da))
        if db_ >= nd - 2 or dm < nd - 2:
            refuse(f"tensor dims {da} and {db} are split over two mesh dims ({_axis_names(mesh, [i, j])})")
        # An expert stack with its experts (a batch dim) over one mesh dim and a matrix dim over
        # the other (torchtitan's EP x FSDP with shard_placement_fn Shard(1)): this EP rank's
        # experts, whole along the batch dim, registered as a stack of their own split on the
        # matrix dim over the other mesh dim's group (shard_over; assembled over that group).
        if p.shape[db_] % mesh.size(b) != 0:
            refuse(f"its {p.shape[db_]} experts (dim {db_}) are split over {mesh.size(b)} ranks "
                   f"({_axis_names(mesh, [b])}) unevenly; dion_cpp needs the same number of experts on "
                   f"every rank (dim {db_} divisible by {mesh.size(b)})")
        return ParamLayout(EXPERT_SHARDS, desc, dim=dm, axis=mesh_dim_axis(mesh, m), inner_dim=db_,
                           mesh=mesh, mesh_dims=(b, m),
                           placement=f"experts over {_axis_names(mesh, [b])}, Shard({dm}) over "
                                     f"{_axis_names(mesh, [m])}")
    return ParamLayout(TWO_D, desc, dim=da, axis=mesh_dim_axis(mesh, i), inner_dim=db,
                       inner_axis=mesh_dim_axis(mesh, j), mesh_dims=(i, j),
                       placement=f"Shard({da}) over {_axis_names(mesh, [i])}, "
                                 f"Shard({db}) over {_axis_names(mesh, [j])}")


class Plan:
    """The OUTER and INNER groups chosen from the parameters' layouts (see the module's docstring).
    `fixed`: distributed_mesh's group when it is a ProcessGroup or a 1-D mesh; `mesh`: an N-D
    distributed_mesh (its dims are the allowed groups)."""

    def __init__(self, owner: str, fixed: Optional[Axis] = None, mesh=None):
        self.owner = owner
        self.outer: Optional[Axis] = fixed
        self.inner: Optional[Axis] = None
        self.outer_by = "distributed_mesh" if fixed is not None else None
        self.inner_by: Optional[str] = None
        self.mesh = mesh
        self.frozen = False  # after construction: a new parameter cannot change the groups
        self.layouts: Dict[torch.Tensor, ParamLayout] = {}

    def _conflict(self, L: ParamLayout, role: str, want: Axis, have: Axis, by: str):
        raise NotImplementedError(
            f"{self.owner}: {L.desc} needs the {role} group to be {want.label}, but {by} makes it "
            f"{have.label}: a dion_cpp optimizer shards over one outer (FSDP) group and one inner "
            "(TP) group; give parameters sharded over other meshes their own optimizer")

    def _set(self, role: str, axis: Axis, L: ParamLayout) -> None:
        if self.frozen:
            raise NotImplementedError(
                f"{self.owner}: {L.desc} (added after construction) needs {role} group {axis.label}, which "
                "this optimizer was not built with: pass every parameter at construction")
        if role == "outer":
            self.outer, self.outer_by = axis, L.desc
        else:
            self.inner, self.inner_by = axis, L.desc

    def add(self, layouts: List[Tuple[torch.Tensor, ParamLayout]]) -> None:
        """Resolve the groups of `layouts`: the outer group from the first SHARD parameter (they
        cannot swap), else from the first TWO_D one; the inner group from the TWO_D ones; then
        every SHARD parameter checked against them."""
        for _, L in layouts:
            if L.kind == SHARD and self.outer is None:
                self._set("outer", L.axis, L)
        for _, L in layouts:
            if L.kind != TWO_D:
                continue
            if self.outer is None:
                self._set("outer", L.axis, L)
            if self.outer.same(L.axis):
                other, L.swapped = L.inner_axis, False
            elif self.outer.same(L.inner_axis):
                other, L.swapped = L.axis, True
            else:
                self._conflict(L, "outer", L.axis, self.outer, self.outer_by)
            if self.inner is None:
                self._set("inner", other, L)
            elif not self.inner.same(other):
                self._conflict(L, "inner", other, self.inner, self.inner_by)
        for _, L in layouts:
            if L.kind == SHARD and not self.outer.same(L.axis):
                if L.axis.same(self.inner):
                    raise NotImplementedError(
                        f"{self.owner}: {L.desc} is sharded over the inner (TP) group only ({L.axis.label}); "
                        f"dion_cpp needs its other matrix dim sharded over the outer group ({self.outer.label}) "
                        f"too (FSDP x TP), or it replicated; {WHAT_WORKS}")
                self._conflict(L, "outer", L.axis, self.outer, self.outer_by)
        for _, L in layouts:
            if L.kind == BATCH:  # the outer group's own ProcessGroup (not another of the same ranks)
                L.on_outer = self.outer is not None and L.axis.group == self.outer.group
        if self.mesh is not None:  # an N-D distributed_mesh: the groups are its dims
            dims = [mesh_dim_axis(self.mesh, i) for i in range(self.mesh.ndim) if self.mesh.size(i) > 1]
            for role, axis, by in (("outer", self.outer, self.outer_by), ("inner", self.inner, self.inner_by)):
                if axis is not None and not any(axis.same(d) for d in dims):
                    raise ValueError(
                        f"{self.owner}: {by} makes the {role} group {axis.label}, which is no dim of "
                        f"distributed_mesh {mesh_str(self.mesh)}: pass the parameters' mesh (or omit "
                        "distributed_mesh: the groups then come from the parameters)")
        self.layouts.update(layouts)


def is_mesh(obj) -> bool:
    return _DeviceMesh is not None and isinstance(obj, _DeviceMesh)


# ---------------------------------------------------------------------------- describe()
_COLUMNS = ("name", "group", "algorithm", "shape", "local", "placements", "layout", "orthogonalized")


class Description(list):
    """describe()'s rows (dicts with the keys of _COLUMNS); str() is a table."""

    def __str__(self) -> str:
        cells = [list(_COLUMNS)] + [[str(r[c]) for c in _COLUMNS] for r in self]
        widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    __repr__ = __str__


def _layout_text(opt, p, L: Optional[ParamLayout]) -> str:
    """Where the C++ optimizer puts p (its Distribution layout)."""
    plan = getattr(opt, "_plan", None)
    outer = plan.outer if plan is not None else None
    if L is None:
        if _is_dtensor(p):  # legacy Dion's shard meshes (_ShardMeshes)
            return "the shard meshes' layout (outer_shard_mesh / inner_shard_mesh)"
        if outer is not None:
            return f"replicated: DDP over {outer.label}"
        return "local (one process)"
    if L.kind == LOCAL:
        return f"replicated: DDP over {outer.label}" if outer is not None else "replicated (each rank all of it)"
    if L.kind == SHARD:
        return f"{L.placement}: FSDP (outer group)"
    if L.kind == TWO_D:
        return f"{L.placement}: FSDP x TP (outer x inner group)"
    if L.kind == BATCH:
        return f"{L.placement}: " + ("FSDP (outer group)" if L.on_outer else "expert parallelism (shard_over)")
    if L.kind == EXPERT_SHARDS:
        return f"{L.placement}: this rank's experts, assembled over {L.axis.label} (shard_over)"
    if L.kind == SPLIT_TWICE:
        return f"{L.placement}: assembled over every rank of the two mesh dims, in chunk order (shard_over)"
    ranks = 1
    for i in L.mesh_dims:
        ranks *= L.mesh.size(i)
    return f"{L.placement}: EP x FSDP (shard_over {ranks} ranks)"


def _ortho_text(algorithm: str, group: dict, p: torch.Tensor, L: Optional[ParamLayout], matrix: bool) -> str:
    """How the algorithm treats p's matrices."""
    if not matrix:
        return f"element-wise ({algorithm})"
    shape = list(p.shape)
    if len(shape) < 2:
        return f"not a matrix ({len(shape)}-D): {algorithm} refuses it; put it in a scalar group (adamw, lion)"
    m, n = shape[-2], shape[-1]
    heads = group.get("num_heads") or 0
    splits = group.get("split_sizes") or ()
    kind = L.kind if L is not None else LOCAL
    if heads > 1:
        text = f"per head: num_heads={heads}, {heads} x [{shape[0] // heads}, {', '.join(map(str, shape[1:]))}]"
        if kind in (TWO_D, BATCH, EXPERTS) or (kind == SHARD and L.dim != 0):
            text += " (refused at step(): num_heads needs whole heads on every rank: Shard(0) or none)"
        elif kind == EXPERT_SHARDS:
            text += " (refused at step(): num_heads on expert shards)"
    elif len(shape) >= 3 and group.get("flatten"):
        rest = 1
        for d in shape[1:]:
            rest *= d
        text = f"flattened: one [{shape[0]}, {rest}] matrix"
    elif len(shape) >= 3:
        count = 1
        for d in shape[:-2]:
            count *= d
        if kind in (BATCH, EXPERTS):
            here = p._local_tensor.shape[0] if _is_dtensor(p) else shape[0]
            text = f"{count} experts, each [{m}, {n}], whole where they are ({here} on this rank), batched"
        elif kind == EXPERT_SHARDS:
            here = p._local_tensor.shape[L.inner_dim]
            text = (f"{count} experts, each [{m}, {n}], batched; this rank's {here} assembled from their "
                    f"shards on dim {L.dim}")
        else:
            text = f"{count} matrices [{m}, {n}], batched"
    elif splits:
        text = f"split_sizes={tuple(splits)}: {len(splits)} matrices [s, {n}] along dim 0"
    else:
        text = f"whole matrix [{m}, {n}]"
        if kind in (SHARD, SPLIT_TWICE):
            text += ", assembled from its FSDP shards"
        elif kind == TWO_D:
            text += ", assembled from its FSDP x TP shards"
    # What the group's own keys say (the class table gives a group only its algorithm's keys: a
    # selecting algorithm's group has `fraction`, a low-rank one's `rank_fraction`).
    if "fraction" in group:
        text += (f"; selects fraction={group.get('fraction')} of the {group.get('selection_dim', 'shorter')} dim's "
                 f"slices, selection_scope={group.get('selection_scope')}")
    elif "rank_fraction" in group:
        text += f"; low rank: rank_fraction={group.get('rank_fraction')}"
    return text


def describe_row(opt, name: str, g: int, group: dict, p: torch.Tensor, L: Optional[ParamLayout]) -> dict:
    from . import _C
    algorithm = group.get("algorithm") or opt.algorithm
    matrix = next((a["matrix"] for a in _C.algorithms() if algorithm == a["name"] or algorithm in a["aliases"]),
                  True)
    local = list(p._local_tensor.shape) if _is_dtensor(p) else list(p.shape)
    placements = (f"{placements_str(p.placements)} on {mesh_str(p.device_mesh)}" if _is_dtensor(p)
                  else "plain tensor")
    return {"name": name, "group": g, "algorithm": algorithm, "shape": list(p.shape), "local": local,
            "placements": placements, "layout": _layout_text(opt, p, L),
            "orthogonalized": _ortho_text(algorithm, group, p, L, matrix)}
