"""Expert parallelism from Python: torchtitan's convention on 2 Gloo processes against one process.

What it checks: a small MoE-like set of parameters — a dense [32, 32] weight replicated, and
expert stacks [4, 48, 32] and [4, 32, 48] as DTensors Shard(0) on an "ep" mesh of the 2 ranks
(the C++ Distribution::shard_over) — stepped 3 times with Dion2 (fraction 0.5), Muon, NorMuon
and Dion3, equals the same plain tensors stepped in one process, bit for bit: each expert's
matrices are whole on one rank and every algorithm treats the matrices of a stack one by one
(tests/optim/test_expert_parallel.cpp says the same of the C++ side). Two ways to hold the dense
weight: a plain tensor with no distributed_mesh (the optimizer has no DDP group; the experts
bring their own) and DDP over a distributed_mesh that is a different ProcessGroup of the same
ranks (so the EP mesh is not the optimizer's: shard_over, not shard). The ranks must have held
different experts. The momentum of an expert stack is handed back as a DTensor of its placement,
and a state_dict() round trip continues bit-identically (checkpoint_*). Also: legacy Dion
refuses an expert stack with the message naming what to use instead.

How: one 2-process job (spawn_job.run_job) runs every case and reports {case: (ok, detail)}.
"""

import pytest
import torch
import torch.distributed as dist

import dion_cpp
from spawn_job import run_cases, run_job

WORLD = 2
STEPS = 3
JOB_TIMEOUT_S = 150
GROUP_TIMEOUT_S = 60
SHAPES = [(32, 32), (4, 48, 32), (4, 32, 48)]  # dense, then the expert stacks
EXPERTS = (1, 2)

CLASSES = {
    "dion2": (dion_cpp.Dion2, {"fraction": 0.5}),
    "muon": (dion_cpp.Muon, {}),
    "normuon": (dion_cpp.NorMuon, {}),
    "dion3": (dion_cpp.Dion3, {}),
}


def full_params():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in SHAPES]


def full_grads(step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def train(name, params, grads_of, **mesh):
    cls, kwargs = CLASSES[name]
    opt = cls(params, lr=0.02, weight_decay=0.01, **kwargs, **mesh)
    for step in range(STEPS):
        for p, g in zip(params, grads_of(step)):
            p.grad = g
        opt.step()
    return opt


def case_experts(name, dense_ddp):
    """The dense weight replicated (plain tensor; DDP over its own group when dense_ddp), the
    expert stacks Shard(0) on the "ep" mesh; 3 steps vs one process, bit for bit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    want = full_params()
    want_opt = train(name, want, full_grads)

    ep = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("ep",))

    def place(tensors):
        return [distribute_tensor(t, ep, [Shard(0)]) if i in EXPERTS else t for i, t in enumerate(tensors)]

    params = [torch.nn.Parameter(t) for t in place(full_params())]
    mesh = {"distributed_mesh": dist.new_group(ranks=list(range(WORLD)))} if dense_ddp else {}
    opt = train(name, params, lambda step: place(full_grads(step)), **mesh)
    got = [p.full_tensor() if isinstance(p, DTensor) else p.detach() for p in params]
    diffs = [(g - w).abs().max().item() for g, w in zip(got, want)]
    same = all(torch.equal(g, w) for g, w in zip(got, want))
    # Each rank held its own 2 experts (and they differ from the other rank's).
    rank = dist.get_rank()
    mine = [params[i].to_local() for i in EXPERTS]
    held_own = all(m.shape[0] == 2 and torch.equal(m, want[i][2 * rank:2 * rank + 2])
                   for m, i in zip(mine, EXPERTS))
    others = [torch.empty_like(m) for m in mine]
    for m, o in zip(mine, others):
        gathered = [torch.empty_like(m) for _ in range(WORLD)]
        dist.all_gather(gathered, m.contiguous())
        o.copy_(gathered[1 - rank])
    distinct = all(not torch.equal(m, o) for m, o in zip(mine, others))
    # State of an expert stack: a DTensor of the parameter's placement, the one process's values.
    m = opt.state[params[1]]["momentum"]
    state_ok = (isinstance(m, DTensor) and m.placements == params[1].placements
                and torch.equal(m.full_tensor(), want_opt.state[want[1]]["momentum"]))
    # Registered over the EP mesh's group (shard_over), not as shards of the optimizer's group.
    over_ep = len(opt._expert_groups) == len(EXPERTS)
    ok = same and held_own and distinct and state_ok and over_ep
    return ok, (f"max |diff| per parameter {diffs} (want 0); over the EP group: {over_ep}; "
                f"held own experts: {held_own}; "
                f"ranks' experts differ: {distinct}; expert momentum a DTensor equal to one process's: {state_ok}")


def case_checkpoint(name):
    """state_dict() of an optimizer over expert stacks (DTensor state) loads into a fresh one
    over copies of the same stacks, and both take the next step bit-identically."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    ep = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("ep",))

    def place(tensors):
        return [distribute_tensor(t, ep, [Shard(0)]) if i in EXPERTS else t for i, t in enumerate(tensors)]

    params = [torch.nn.Parameter(t) for t in place(full_params())]
    opt = train(name, params, lambda step: place(full_grads(step)))
    copies = [torch.nn.Parameter(t) for t in place([p.detach().full_tensor() if i in EXPERTS else p.detach().clone()
                                                    for i, p in enumerate(params)])]
    cls, kwargs = CLASSES[name]
    fresh = cls(copies, lr=0.02, weight_decay=0.01, **kwargs)
    fresh.load_state_dict(opt.state_dict())
    for o, ps in ((opt, params), (fresh, copies)):
        for p, g in zip(ps, place(full_grads(STEPS))):
            p.grad = g
        o.step()
    local = [p.to_local() if i in EXPERTS else p.detach() for i, p in enumerate(params)]
    same = all(torch.equal(a, b.to_local() if i in EXPERTS else b.detach())
               for i, (a, b) in enumerate(zip(local, copies)))
    return same, "the next step after load_state_dict is bit-identical" if same else "differs"


def case_dion_refused():
    """Legacy Dion on an expert stack: NotImplementedError naming what to use instead."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    ep = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("ep",))
    stack = torch.nn.Parameter(distribute_tensor(torch.randn(4, 48, 32), ep, [Shard(0)]))
    try:
        dion_cpp.Dion([torch.nn.Parameter(torch.randn(32, 32)), stack], lr=0.02)
    except NotImplementedError as e:
        text = ("parameter 1 of shape [4, 48, 32]: legacy 'dion' does not support expert-parallel "
                "parameters (shard_over); for expert weights (an MoE's [E, out, in] stacks, expert "
                "parallelism) use Muon, NorMuon, Dion2 or Dion3")
        return text in str(e), str(e)
    except Exception as e:  # noqa: BLE001
        return False, f"raised {type(e).__name__}: {e}"
    return False, "no error"


CASES = {
    **{f"experts_{name}_{how}": (lambda name=name, ddp=ddp: case_experts(name, ddp))
       for name in CLASSES for how, ddp in (("no_mesh", False), ("ddp", True))},
    **{f"checkpoint_{name}": (lambda name=name: case_checkpoint(name)) for name in ("normuon", "dion3")},
    "dion_refused": case_dion_refused,
}


def _worker(rank, world, port, report):
    # One process and a rank's share run bf16 GEMMs over other batch sizes (Dion3's 12-row
    # selection: A.A is 12x12x12, 4 experts in one process, 2 on a rank); ATen sends a batch to
    # oneDNN only above 4096 multiply-adds (mkldnn/Matmul.cpp) and oneDNN's AVX-512 / AMX kernels
    # round a few elements otherwise than ATen's gemm. Off: both sides run ATen's gemm per matrix
    # and compare bit for bit (tests/support/cpu_kind.h says the same for the C++ tests).
    torch.backends.mkldnn.enabled = False
    run_cases(rank, world, port, report, CASES, GROUP_TIMEOUT_S)


@pytest.fixture(scope="module")
def report():
    return run_job(_worker, WORLD, WORLD, JOB_TIMEOUT_S, "the 2-process expert-parallel job", join_timeout_s=5)


@pytest.mark.parametrize("case", list(CASES))
def test_expert_parallel_matches_one_process(report, case):
    for rank in range(WORLD):
        if "setup" in report[rank]:
            pytest.fail(f"rank {rank}: {report[rank]['setup'][1]}")
        ok, detail = report[rank][case]
        assert ok, f"rank {rank}, {case}: {detail}"
