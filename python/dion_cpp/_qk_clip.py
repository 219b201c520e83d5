"""QK-clip (Kimi K2's MuonClip) after any optimizer's step, on any layout of the attention weights.

    clip = dion_cpp.QKClip(tau=100.0, layers=[(blk.attn.wq.weight, blk.attn.wk.weight, n_heads, n_kv_heads)
                                              for blk in model.layers])
    loss.backward(); opt.step()
    clip.apply(max_logits)   # max_logits[l]: this rank's [n_heads] largest pre-softmax logits of layer l
    # in the attention's forward, with SDPA / flash: QKClip.max_logits(q, k) -> [n_heads]

For every head h whose largest logit S_h (over every rank's batch) is above tau, gamma_h = tau / S_h;
with as many key heads as query heads, W_q's and W_k's rows of head h are scaled by sqrt(gamma_h);
with fewer key heads (GQA, MQA), W_q's rows of head h by gamma_h and W_k not at all. Either way the
same inputs give head h a largest logit of tau. The math is C++ (include/dion/math/qk_clip.h), so
is the one collective: every layer's maxima packed into one vector, one all_gather over
`process_group`, the max over the ranks; each rank then scales its own rows.

The weights: torch Linear weights [n_heads * head_dim, in] with the heads major (wq) and
[n_kv_heads * head_dim, in] (wk), plain tensors or DTensors on any mesh: a DTensor's local rows
are found from its placements (Shard(0), _StridedShard(0) and their nesting; Shard(1) and
Replicate leave every row here); Partial is refused. A fused qkv weight is not supported: pass
wq and wk views of it, each [heads * head_dim, in].
The maxima: what the attention computed on this rank, one [n_heads] tensor a layer in the order
of `layers`, -inf for a head this rank computed nothing of (a tensor-parallel rank's other heads).
A model that normalizes q and k (QK norm) has bounded logits already: QK-clip is for models
without it (scaling W_q there changes nothing the softmax sees).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from . import _C
from ._dist import _DeviceMesh, _StridedShard, _distributed_optimizers, _is_dtensor


def _rows(w: torch.Tensor, name: str) -> Optional[torch.Tensor]:
    """The global row of each local row of a DTensor weight (int64, CPU); None for a plain tensor."""
    if not _is_dtensor(w):
        return None
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import Partial
    keep = []
    for pl in w.placements:
        if isinstance(pl, Partial):
            raise ValueError(f"QKClip: {name} has a Partial placement ({w.placements}); reduce it to a "
                             f"Shard or Replicate (full_tensor() or redistribute) before the step")
        dim = getattr(pl, "dim", None)
        row_shard = isinstance(pl, Shard) or (_StridedShard is not None and isinstance(pl, _StridedShard))
        keep.append(pl if row_shard and dim == 0 else Replicate())
    if w.dim() != 2:
        raise ValueError(f"QKClip: {name} is {w.dim()}-D {list(w.shape)}; a 2-D [heads * head_dim, in] weight is needed")
    index = torch.arange(w.shape[0], dtype=torch.int64, device=w._local_tensor.device).unsqueeze(1)
    local = distribute_tensor(index, w.device_mesh, keep, src_data_rank=None)._local_tensor[:, 0]
    if local.numel() != w._local_tensor.shape[0]:
        raise ValueError(f"QKClip: {name}: {w._local_tensor.shape[0]} local rows, but its placements "
                         f"{w.placements} give {local.numel()}")
    return local.cpu()


def _group(process_group, weights):
    """(ProcessGroup or None, its global ranks) over which the maxima are combined."""
    if not dist.is_available() or not dist.is_initialized():
        if process_group is not None:
            raise ValueError("QKClip: process_group given but torch.distributed is not initialized")
        return None, []
    if process_group is None:
        meshes = {w.device_mesh for w in weights if _is_dtensor(w)}
        process_group = dist.group.WORLD
        for mesh in meshes:  # every rank of the weights' meshes must be in the group: the world is
            if mesh.size() != dist.get_world_size():
                raise ValueError(f"QKClip: the weights' mesh spans {mesh.size()} of the {dist.get_world_size()} "
                                 f"ranks; pass process_group= the group of the ranks that compute this model's logits")
    elif _DeviceMesh is not None and isinstance(process_group, _DeviceMesh):
        if process_group.ndim == 1:
            process_group = process_group.get_group()
        elif process_group.size() == dist.get_world_size():
            process_group = dist.group.WORLD
        else:
            raise ValueError(f"QKClip: a {process_group.ndim}-D DeviceMesh of {process_group.size()} of the "
                             f"{dist.get_world_size()} ranks; pass a ProcessGroup of its ranks (dist.new_group)")
    if dist.get_world_size(process_group) == 1:
        return None, []
    return process_group, dist.get_process_group_ranks(process_group)


class QKClip:
    """QK-clip after the optimizer's step (module docstring). `layers`: (wq, wk, n_heads,
    n_kv_heads) tuples or dicts with keys wq, wk, n_heads, n_kv_heads (default n_heads), head_dim
    (default: wq's rows / n_heads), name (default "layer<i>"). `process_group`: the ranks whose
    maxima are combined (default: the world, when torch.distributed is initialized); a DeviceMesh
    is taken as its ranks."""

    def __init__(self, tau: float, layers: Sequence, process_group=None):
        specs, weights = [], []
        for i, layer in enumerate(layers):
            if isinstance(layer, dict):
                d = dict(layer)
            else:
                wq, wk, n_heads, *rest = layer
                d = {"wq": wq, "wk": wk, "n_heads": n_heads, "n_kv_heads": rest[0] if rest else n_heads}
            d.setdefault("name", f"layer{i}")
            d.setdefault("n_kv_heads", d["n_heads"])
            for key in ("wq", "wk"):
                if not isinstance(d.get(key), torch.Tensor):
                    raise TypeError(f"QKClip: layer {d['name']}: {key} must be a tensor, got {type(d.get(key))}")
            d.setdefault("head_dim", d["wq"].shape[0] // max(1, int(d["n_heads"])))
            d["wq_rows"], d["wk_rows"] = _rows(d["wq"], f"{d['name']}.wq"), _rows(d["wk"], f"{d['name']}.wk")
            weights += [d["wq"], d["wk"]]
            d["wq"] = d["wq"]._local_tensor if _is_dtensor(d["wq"]) else d["wq"]
            d["wk"] = d["wk"]._local_tensor if _is_dtensor(d["wk"]) else d["wk"]
            specs.append(d)
        group, ranks = _group(process_group, weights)
        self._cpp = _C.QkClip(float(tau), specs, group, ranks)
        self.tau = float(tau)
        if group is not None:
            _distributed_optimizers.add(self)  # released at interpreter exit (_dist._release_at_exit)

    @staticmethod
    @torch.no_grad()
    def max_logits(q: torch.Tensor, k: torch.Tensor, scale: Optional[float] = None, causal: bool = True,
                   block: int = 1024) -> torch.Tensor:
        """The largest pre-softmax logit of each query head, for attentions that do not expose
        their scores (SDPA, flash): q [B, H, T, D], k [B, H_kv, S, D] (H_kv dividing H), scale
        (default 1 / sqrt(D), SDPA's), causal (query i sees keys <= i + S - T, SDPA's
        is_causal for S == T). Returns float32 [H]; queries in blocks of `block` rows, so the
        scores are never [T, S] whole. Call it in the forward (its q and k), max over micro-batches."""
        B, H, T, D = q.shape
        g = H // k.shape[1]
        kk = (k.repeat_interleave(g, 1) if g > 1 else k).float()
        scale = D ** -0.5 if scale is None else scale
        S = kk.shape[2]
        out = torch.full((H,), float("-inf"), device=q.device)
        for t0 in range(0, T, block):
            s = torch.matmul(q[:, :, t0:t0 + block].float(), kk.transpose(-1, -2)) * scale  # [B, H, t, S]
            if causal:
                rows = torch.arange(t0, t0 + s.shape[2], device=q.device).unsqueeze(1) + (S - T)
                s = s.masked_fill(torch.arange(S, device=q.device).unsqueeze(0) > rows, float("-inf"))
            out = torch.maximum(out, s.transpose(0, 1).reshape(H, -1).amax(1))
        return out.cpu()

    def apply(self, max_logits: List[torch.Tensor]) -> torch.Tensor:
        """Scale the weights of every head whose largest logit (max over the ranks) is above tau;
        returns the global maxima [layers, most heads of a layer] (float32, -inf padded). Every
        rank calls it, after the optimizer's step, with its own maxima."""
        return self._cpp.apply([torch.as_tensor(m) for m in max_logits])
