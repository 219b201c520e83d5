"""tests/multihost/dion_cpp_steps.py — dion_cpp's optimizers under torch's launcher (one script, any layout).

    PYTHONPATH=build/python torchrun --nnodes 2 --node_rank K --nproc_per_node 2 \\
        --master_addr HOST0 --master_port P tests/multihost/dion_cpp_steps.py OUT.pt
    PYTHONPATH=build/python torchrun --standalone --nproc_per_node 4 tests/multihost/dion_cpp_steps.py OUT.pt

Every rank joins torch.distributed (Gloo, the launcher's env://) and takes STEPS optimizer steps
with Muon and Dion2 (fraction 0.5, global selection) twice: DDP (replicated tensors, the same
gradients on every rank, distributed_mesh = the world group) and FSDP (DTensor parameters
Shard(0) over a 1-D mesh of every rank, uneven shards included), and each optimizer without a
mesh over full copies (one process's result: every rank computes it). Rank 0 writes OUT.pt:
{"world": N, "ddp:muon": [full params], "fsdp:muon": [...], ..., "single:muon": [...]} and prints
one line per case with its max relative difference to one process (DDP bit-identical, FSDP within
1e-5: tests/python/test_distributed.py's). Used by tests/multihost/test_multihost.py (2 hosts x 2 against one host x 4).
"""
import datetime
import sys

import torch
import torch.distributed as dist

import dion_cpp

STEPS = 3
SHAPES = [(8, 16)] * 3 + [(12, 18), (7, 10), (3, 16)]  # a megabatch of 3, rows fewer than ranks
VECTOR = (10,)
KINDS = {"muon": dion_cpp.Muon, "dion2": dion_cpp.Dion2}


def full_params():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in SHAPES + [VECTOR]]


def full_grads(step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=g) for s in SHAPES + [VECTOR]]


def train(kind, params, grads_of, **mesh):
    n = len(SHAPES)
    extra = {"fraction": 0.5, "selection_scope": "global"} if kind == "dion2" else {}
    opt = KINDS[kind]([{"params": params[:n]}, {"params": params[n:], "algorithm": "adamw"}], lr=0.02,
                      **extra, **mesh)
    for step in range(STEPS):
        for p, g in zip(params, grads_of(step)):
            p.grad = g
        opt.step()


def main(out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)  # more ranks than cores on the test machine
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    result = {"world": world}
    for kind in KINDS:
        params = full_params()
        train(kind, params, full_grads, distributed_mesh=dist.group.WORLD)
        result[f"ddp:{kind}"] = params

        def shard(tensors):
            return [distribute_tensor(t, mesh, [Shard(0)]) for t in tensors]

        params = [torch.nn.Parameter(t) for t in shard(full_params())]
        train(kind, params, lambda step: shard(full_grads(step)), distributed_mesh=mesh)
        result[f"fsdp:{kind}"] = [p.detach().full_tensor() for p in params]
        single = full_params()  # on every rank: with a process group, a plain optimizer's step checks
        train(kind, single, full_grads)  # that the replicas agree (collective)
        result[f"single:{kind}"] = single
        if rank == 0:
            scale = max(w.abs().max().item() for w in single)
            for layout in ("ddp", "fsdp"):
                got = result[f"{layout}:{kind}"]
                rel = max((a - b).abs().max().item() for a, b in zip(got, single)) / scale
                same = all(torch.equal(a, b) for a, b in zip(got, single))
                print(f"[rank 0 of {world}] {layout} {kind}: max relative difference to one process {rel:.3g}"
                      f"{' (bit-identical)' if same else ''}", flush=True)
    if rank == 0:
        torch.save(result, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
