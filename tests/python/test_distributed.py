"""dion_cpp over torch.distributed: 2 processes (Gloo on 127.0.0.1) against one process.

What it checks: each rank runs the same training steps twice — once with a distributed
optimizer (DDP: a ProcessGroup and replicated parameters; FSDP2: a 1-D DeviceMesh and DTensor
parameters made with distribute_tensor(full, mesh, [Shard(dim)])) and once with a
single-process optimizer over full copies — and compares the full parameters after 3 steps.
  DDP:   bit-identical (each rank orthogonalizes part of the megabatch; the same kernels run on
         the same matrices, so the results are the single-process ones exactly); legacy Dion
         1e-5 (per-rank randomized QR sketches).
  FSDP2: within 1e-5 relative to the largest element (shards are assembled into whole
         matrices on their owner ranks, so the math is the same; zero padding of uneven
         shards and summed norms may change rounding at the 1e-7 level).
Dion2 / NorDion2 use selection_scope="global" under FSDP: the "local" scope selects within each
shard by design (the reference's semantics) and is not the single-process result.

How: one 2-process job (torch.multiprocessing, spawn) runs every case and reports
{case: (ok, detail)} per rank through a queue; the pytest cases read that report. The job is
killed and the tests fail if it takes longer than JOB_TIMEOUT_S; collectives time out after
GROUP_TIMEOUT_S, so a failing rank cannot leave its peer waiting forever.
"""
import datetime
import os
import queue as queue_mod
import socket
import traceback

import pytest
import torch
import torch.distributed as dist

import dion_cpp

WORLD = 2
STEPS = 3
JOB_TIMEOUT_S = 50
GROUP_TIMEOUT_S = 20
FSDP_RTOL = 1e-5

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the Gloo backend is not available in this torch build")

KINDS = {"muon": dion_cpp.Muon, "normuon": dion_cpp.NorMuon, "dion2": dion_cpp.Dion2,
         "nordion2": dion_cpp.NorDion2, "dion": dion_cpp.Dion}


# ---------------------------------------------------------------------------- the model
# Matrices (a megabatch of 3 of one shape, others alone, uneven shards) plus an AdamW vector
# group: the shapes of a small model. Same seed on every rank: DDP's replicas.

DDP_SHAPES = [(16, 8), (16, 8), (16, 8), (18, 12), (7, 10)]
VECTOR_SHAPES = [(10,)]


def full_params(shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in list(shapes) + VECTOR_SHAPES]


def full_grads(shapes, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=g) for s in list(shapes) + VECTOR_SHAPES]


def options(kind, sharded):
    if kind in ("dion2", "nordion2"):
        return {"fraction": 0.5, "selection_scope": "global" if sharded else "local"}
    return {}


def train(kind, params, grads_of, sharded=False, **mesh):
    """STEPS steps over `params` (the matrices, then the AdamW vectors); `grads_of(step)`
    returns every parameter's gradient."""
    n = len(params) - len(VECTOR_SHAPES)
    torch.manual_seed(0)  # legacy Dion draws its Q at the first step
    opt = KINDS[kind]([{"params": params[:n]}, {"params": params[n:], "algorithm": "adamw"}],
                      lr=0.02, **options(kind, sharded), **mesh)
    for step in range(STEPS):
        for p, g in zip(params, grads_of(step)):
            p.grad = g
        opt.step()
    return opt


def single_process(kind, shapes, sharded=False):
    params = full_params(shapes)
    opt = train(kind, params, lambda step: full_grads(shapes, step), sharded)
    return params, opt


def max_rel(got, want):
    scale = max(w.abs().max().item() for w in want)
    return max((g - w).abs().max().item() for g, w in zip(got, want)) / scale


# ---------------------------------------------------------------------------- the cases


def case_ddp(kind):
    """Replicated plain tensors, the same gradients on every rank: bit-identical. Legacy Dion:
    1e-5, as in tests/test_dist.cpp (each rank's randomized QR draws its own sketch, which
    changes P by column signs and rounding only)."""
    want, _ = single_process(kind, DDP_SHAPES)
    params = full_params(DDP_SHAPES)
    mesh = {"replicate_mesh" if kind == "dion" else "distributed_mesh": dist.group.WORLD}
    train(kind, params, lambda step: full_grads(DDP_SHAPES, step), **mesh)
    rel = max_rel(params, want)
    if kind == "dion":
        return rel <= FSDP_RTOL, f"max relative difference {rel:.3g} (tolerance {FSDP_RTOL})"
    same = all(torch.equal(p, w) for p, w in zip(params, want))
    return same, f"max relative difference {rel:.3g} (want bit-identical)"


def case_fsdp(kind, specs):
    """DTensor parameters Shard(dim) over a 1-D mesh (specs: (shape, dim or None for
    Replicate())), gradients DTensors of the same placement; full_tensor() after the steps vs
    one process. The sharded dim is each matrix's shorter one: Dion2 selects along the sharded
    dim under FSDP (as the reference), which single-process Dion2 picks only when it is the
    shorter one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    shapes = [shape for shape, _ in specs]
    want, want_opt = single_process(kind, shapes, sharded=True)
    mesh = init_device_mesh("cpu", (WORLD,))
    placements = [[Shard(d)] if d is not None else [Replicate()] for _, d in specs] + [[Shard(0)]]

    def shard(tensors):
        return [distribute_tensor(t, mesh, pl) for t, pl in zip(tensors, placements)]

    params = [torch.nn.Parameter(t) for t in shard(full_params(shapes))]
    opt = train(kind, params, lambda step: shard(full_grads(shapes, step)), sharded=True,
                distributed_mesh=mesh)
    rel = max_rel([p.full_tensor() for p in params], want)
    # The state is handed back as DTensors over the live C++ tensors.
    m = opt.state[params[0]]["momentum"]
    state_ok = isinstance(m, DTensor) and m.shape == params[0].shape
    state_rel = max_rel([m.full_tensor()], [want_opt.state[want[0]]["momentum"]]) if state_ok else float("inf")
    return (rel <= FSDP_RTOL and state_rel <= FSDP_RTOL,
            f"params: max relative difference {rel:.3g}; momentum: {state_rel:.3g} "
            f"(a DTensor: {state_ok}); tolerance {FSDP_RTOL}")


def case_errors():
    """A 2-D mesh is refused as the reference does; legacy Dion refuses sharding meshes."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh2d = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "fs"))
    try:
        dion_cpp.Muon([torch.randn(4, 4)], distributed_mesh=mesh2d)
        return False, "2-D mesh accepted"
    except ValueError as e:
        if "Only 1D DeviceMesh supported" not in str(e):
            return False, f"2-D mesh: unexpected message {e}"
    try:
        dion_cpp.Dion([torch.randn(4, 4)], outer_shard_mesh=mesh2d["fs"])
        return False, "legacy Dion accepted an outer_shard_mesh of 2 ranks"
    except NotImplementedError:
        pass
    return True, "ok"


# Wide matrices sharded on rows: 8 rows / 2 ranks, 7 rows (4 + 3), 3 rows (2 + 1).
ROWS = [((8, 16), 0)] * 3 + [((12, 18), 0), ((7, 10), 0), ((3, 16), 0)]
# Tall matrices sharded on columns (7 columns: 4 + 3), a wide one on rows, one Replicate().
MIXED = [((16, 8), 1), ((16, 8), 1), ((8, 16), 0), ((12, 12), None), ((18, 7), 1)]
CASES = {
    **{f"ddp_{k}": (lambda k=k: case_ddp(k)) for k in KINDS},
    **{f"fsdp_rows_{k}": (lambda k=k: case_fsdp(k, ROWS)) for k in ("muon", "normuon", "dion2", "nordion2")},
    # NorMuon / NorDion2 refuse column sharding (as the reference).
    **{f"fsdp_mixed_{k}": (lambda k=k: case_fsdp(k, MIXED)) for k in ("muon", "dion2")},
    "errors": case_errors,
}


def _worker(rank, port, report):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.manual_seed(0)
    results = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        for name, run in CASES.items():
            try:
                results[name] = run()
            except Exception:  # noqa: BLE001  (reported per case)
                results[name] = (False, traceback.format_exc())
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        results["setup"] = (False, traceback.format_exc())
    report.put((rank, results))


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def report():
    """{rank: {case: (ok, detail)}} from one 2-process job."""
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, q), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(WORLD):
            rank, results = q.get(timeout=JOB_TIMEOUT_S)
            out[rank] = results
    except queue_mod.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    if len(out) < WORLD:
        pytest.fail(f"the {WORLD}-process job did not report within {JOB_TIMEOUT_S} s "
                    f"(ranks that did: {sorted(out)}; exit codes {[p.exitcode for p in procs]})")
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_match_one(report, case):
    for rank in range(WORLD):
        if "setup" in report[rank]:
            pytest.fail(f"rank {rank}: {report[rank]['setup'][1]}")
        ok, detail = report[rank][case]
        assert ok, f"rank {rank}, {case}: {detail}"
