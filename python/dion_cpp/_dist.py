"""dion_cpp's distributed helpers: torch.distributed meshes as the C++ optimizer's groups,
DTensor detection, and the release of distributed optimizers at interpreter exit."""
from __future__ import annotations

import atexit
import weakref

import torch.distributed as dist

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

