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
FSDP2 checkpoints: a sharded optimizer's state_dict() (DTensor state) loads into a fresh one over
the same layout and the next step is bit-identical (fsdp_checkpoint_*).
Dion2 / NorDion2 use selection_scope="global" under FSDP: the "local" scope selects within each
shard by design (the reference's semantics) and is not the single-process result.

Legacy Dion on shard meshes runs in a 4-process job (FSDP, FSDP x TP, HSDP with compressed
sync; see CASES4), against one process within 1e-5.

How: one 2-process job (torch.multiprocessing, spawn) runs every case and reports
{case: (ok, detail)} per rank through a queue; the pytest cases read that report (likewise
the 4-process job). A job is killed and the tests fail if it takes longer than JOB_TIMEOUT_S; collectives time out after
GROUP_TIMEOUT_S, so a failing rank cannot leave its peer waiting forever.
"""

import pytest
import torch
import torch.distributed as dist

import dion_cpp
from spawn_job import check_case, free_port, run_cases, run_job

WORLD = 2
STEPS = 3
JOB_TIMEOUT_S = 150
GROUP_TIMEOUT_S = 60
FSDP_RTOL = 1e-5

# The pinned torch wheel (requirements.txt) has Gloo; a build without it fails here, by name.
assert dist.is_available() and dist.is_gloo_available(), \
    "torch.distributed with the Gloo backend is not available in this torch build"

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
    1e-5, as in tests/optim/test_dist.cpp (each rank's randomized QR draws its own sketch, which
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


def case_fsdp_checkpoint(kind):
    """A sharded optimizer's state_dict() (DTensor state) loads into a fresh sharded optimizer
    over the same layout (all or nothing: every state tensor checked against its local shard),
    and both take the next step bit-identically."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD,))
    shapes = [shape for shape, _ in ROWS]
    placements = [[Shard(d)] for _, d in ROWS] + [[Shard(0)]]

    def shard(tensors):
        return [distribute_tensor(t, mesh, pl) for t, pl in zip(tensors, placements)]

    params = [torch.nn.Parameter(t) for t in shard(full_params(shapes))]
    opt = train(kind, params, lambda step: shard(full_grads(shapes, step)), sharded=True,
                distributed_mesh=mesh)
    copies = [torch.nn.Parameter(t) for t in shard([p.detach().full_tensor() for p in params])]
    n = len(shapes)
    fresh = KINDS[kind]([{"params": copies[:n]}, {"params": copies[n:], "algorithm": "adamw"}],
                        lr=0.02, **options(kind, True), distributed_mesh=mesh)
    fresh.load_state_dict(opt.state_dict())
    for o, ps in ((opt, params), (fresh, copies)):
        for p, g in zip(ps, shard(full_grads(shapes, STEPS))):
            p.grad = g
        o.step()
    same = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(params, copies))
    return same, "the next step after load_state_dict is bit-identical" if same else "differs"


def expect_error(make, error, text):
    """None when make() raises `error` whose message contains `text`, else what went wrong."""
    try:
        make()
    except error as e:
        return None if text in str(e) else f"unexpected message: {e}"
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__} instead of {error.__name__}: {e}"
    return f"no {error.__name__} raised"


def case_errors():
    """Legacy Dion's replicate mesh must be 1-D (a 2-D distributed_mesh is dion_cpp's extension:
    test_placements.py); its shard meshes must be 1-D DeviceMeshes and, with them, every
    parameter a DTensor (the reference's errors)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh2d = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "fs"))
    checks = {
        "2-D replicate_mesh": expect_error(
            lambda: dion_cpp.Dion([torch.randn(4, 4)], replicate_mesh=mesh2d), ValueError,
            "Only 1D DeviceMesh supported"),
        "2-D outer_shard_mesh": expect_error(
            lambda: dion_cpp.Dion([torch.randn(4, 4)], outer_shard_mesh=mesh2d), ValueError,
            "Outer shard mesh must be 1D"),
        "plain tensor with outer_shard_mesh": expect_error(
            lambda: dion_cpp.Dion([torch.randn(4, 4)], outer_shard_mesh=mesh2d["fs"]), TypeError,
            "all parameters must be DTensor"),
    }
    bad = {k: v for k, v in checks.items() if v is not None}
    return not bad, str(bad) if bad else "ok"


# Wide matrices sharded on rows: 8 rows / 2 ranks, 7 rows (4 + 3), 3 rows (2 + 1).
ROWS = [((8, 16), 0)] * 3 + [((12, 18), 0), ((7, 10), 0), ((3, 16), 0)]
# Tall matrices sharded on columns (7 columns: 4 + 3), a wide one on rows, one Replicate().
MIXED = [((16, 8), 1), ((16, 8), 1), ((8, 16), 0), ((12, 12), None), ((18, 7), 1)]
CASES = {
    **{f"ddp_{k}": (lambda k=k: case_ddp(k)) for k in KINDS},
    **{f"fsdp_rows_{k}": (lambda k=k: case_fsdp(k, ROWS)) for k in ("muon", "normuon", "dion2", "nordion2")},
    # Column sharding too (NorMuon / NorDion2 sum their per-neuron statistics over the shards;
    # the reference refuses it for them).
    **{f"fsdp_mixed_{k}": (lambda k=k: case_fsdp(k, MIXED)) for k in ("muon", "normuon", "dion2", "nordion2")},
    **{f"fsdp_checkpoint_{k}": (lambda k=k: case_fsdp_checkpoint(k)) for k in ("normuon", "dion2")},
    "errors": case_errors,
}


# ---------------------------------------------------------------------------- legacy Dion, 4 ranks
# The C++ tests' dion_shard_case (tests/optim/test_dist.cpp) from Python: FSDP (outer_shard_mesh of 2
# ranks), FSDP x TP (2 x 2: outer "fs" x inner "tp") and HSDP (2 x 2: replicate_mesh "dp" with
# replicate_mesh_grad_sync, outer "fs", rank_fraction 0.25), each against one process. Dion
# works on M^T exactly when the outer-sharded dim is 0, so row-sharded matrices are wide (the
# single process transposes those too) and column-sharded ones tall. Both runs seed torch the
# same way and create their state (Q) up front. Randomized QR sketches differ per rank, which
# moves P by column signs and rounding only: tolerance 1e-5 (FSDP_RTOL).

WORLD4 = 4
DION_ROWS = [(8, 16), (8, 16), (12, 20), (3, 16)]  # wide; 3 rows: shards of 2 + 1
DION_COLS = [(16, 8), (20, 12), (16, 3)]  # tall; 3 columns: 2 + 1


def dion_run(params, grads_of, rank_fraction, **meshes):
    """Legacy Dion over `params` (matrices, then the AdamW vectors), state created up front."""
    n = len(params) - len(VECTOR_SHAPES)
    torch.manual_seed(9)  # the same initial Q everywhere
    opt = dion_cpp.Dion([{"params": params[:n]}, {"params": params[n:], "algorithm": "adamw"}],
                        lr=0.02, rank_fraction=rank_fraction, **meshes)
    opt.init_state()
    for step in range(STEPS):
        for p, g in zip(params, grads_of(step)):
            p.grad = g
        opt.step()
    return opt


def case_dion_sharded(layout, shapes, shard_dim, rank_fraction=1.0):
    """layout: "fsdp" (a 1-D "fs" sub-mesh of 2 ranks), "tp" ("fs" x "tp": the other matrix dim
    over "tp") or "hsdp" ("dp" x "fs", a gradient per replica whose mean is the single process's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    want_params = full_params(shapes)
    dion_run(want_params, lambda step: full_grads(shapes, step), rank_fraction)

    names = ("fs", "tp") if layout == "tp" else ("dp", "fs")
    mesh2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    n = len(shapes)
    if layout == "fsdp":
        mesh, meshes = mesh2d["fs"], {"outer_shard_mesh": mesh2d["fs"]}
        placements = [[Shard(shard_dim)]] * n + [[Shard(0)]]
    elif layout == "tp":
        mesh = mesh2d
        meshes = {"outer_shard_mesh": mesh2d["fs"], "inner_shard_mesh": mesh2d["tp"]}
        placements = [[Shard(shard_dim), Shard(1 - shard_dim)]] * n + [[Shard(0), Replicate()]]
    else:
        mesh = mesh2d
        meshes = {"replicate_mesh": mesh2d["dp"], "outer_shard_mesh": mesh2d["fs"],
                  "replicate_mesh_grad_sync": True}
        placements = [[Replicate(), Shard(shard_dim)]] * n + [[Replicate(), Shard(0)]]
    replica = mesh2d.get_local_rank("dp") if layout == "hsdp" else 0

    def per_replica(mean, step, i):
        if layout != "hsdp":
            return mean
        g = torch.Generator().manual_seed(500 + 100 * step + 10 * i)
        a, b = torch.randn(mean.shape, generator=g), torch.randn(mean.shape, generator=g)
        return mean + ((a if replica == 0 else b) - (a + b) / 2)

    def dtensors(tensors):  # each rank's own chunk of its own full tensor: no communication
        return [distribute_tensor(t, mesh, pl, src_data_rank=None) for t, pl in zip(tensors, placements)]

    params = [torch.nn.Parameter(t) for t in dtensors(full_params(shapes))]
    dion_run(params, lambda step: dtensors([per_replica(g, step, i)
                                            for i, g in enumerate(full_grads(shapes, step))]),
             rank_fraction, **meshes)
    rel = max_rel([p.full_tensor() for p in params], want_params)
    return rel <= FSDP_RTOL, f"max relative difference {rel:.3g} (tolerance {FSDP_RTOL})"


def case_dion_errors():
    """The reference's errors for DTensors the shard meshes do not explain."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    fs_tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fs", "tp"))
    dp_fs = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "fs"))

    def dion(mesh, placements, **meshes):
        p = distribute_tensor(torch.randn(8, 16), mesh, placements, src_data_rank=None)
        return dion_cpp.Dion([torch.nn.Parameter(p)], **meshes)

    checks = {
        "sharded over the replicate dim": expect_error(
            lambda: dion(dp_fs, [Shard(0), Replicate()], outer_shard_mesh=dp_fs["fs"]),
            RuntimeError, "unrecognized mesh_dim=0"),
        "double-sharded tensor dim": expect_error(
            lambda: dion(fs_tp, [Shard(0), Shard(0)], outer_shard_mesh=fs_tp["fs"],
                         inner_shard_mesh=fs_tp["tp"]),
            RuntimeError, "double-sharded DTensor for tensor dimension 0"),
        "inner sharding only": expect_error(
            lambda: dion(fs_tp, [Replicate(), Shard(1)], outer_shard_mesh=fs_tp["fs"],
                         inner_shard_mesh=fs_tp["tp"]),
            NotImplementedError, "inner_shard_mesh only"),
        "same outer and inner mesh": expect_error(
            lambda: dion(fs_tp, [Shard(0), Shard(1)], outer_shard_mesh=fs_tp["fs"],
                         inner_shard_mesh=fs_tp["fs"]),
            ValueError, "must be different"),
    }
    bad = {k: v for k, v in checks.items() if v is not None}
    return not bad, str(bad) if bad else "ok"


CASES4 = {
    "dion_fsdp_rows": lambda: case_dion_sharded("fsdp", DION_ROWS, 0),
    "dion_fsdp_cols": lambda: case_dion_sharded("fsdp", DION_COLS, 1),
    "dion_fsdp_x_tp": lambda: case_dion_sharded("tp", DION_ROWS, 0),
    "dion_hsdp_compressed": lambda: case_dion_sharded("hsdp", DION_ROWS, 0, rank_fraction=0.25),
    "dion_errors": case_dion_errors,
}
JOBS = {WORLD: CASES, WORLD4: CASES4}


# ---------------------------------------------------------------------------- the jobs


def _worker(rank, world, port, report):
    if world > 2:
        torch.set_num_threads(1)  # more ranks than the test machine has cores
    run_cases(rank, world, port, report, JOBS[world], GROUP_TIMEOUT_S)


def _run_job(world):
    """{rank: {case: (ok, detail)}} from one `world`-process job running JOBS[world]."""
    return run_job(_worker, world, world, JOB_TIMEOUT_S, f"the {world}-process job", join_timeout_s=5)


@pytest.fixture(scope="module")
def report():
    return _run_job(WORLD)


@pytest.fixture(scope="module")
def report4():
    return _run_job(WORLD4)


check = check_case


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_match_one(report, case):
    check(report, WORLD, case)


@pytest.mark.parametrize("case", list(CASES4))
def test_four_processes_match_one(report4, case):
    check(report4, WORLD4, case)
