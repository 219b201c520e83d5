"""torchtitan's layouts from Python: DTensor placements on N-D meshes against one process.

What it checks (python/dion_cpp/_layouts.py; docs/distributed.md, "DTensor placements"): Muon,
NorMuon, Dion2 (selection_scope="global") and Dion3 step DTensor parameters laid out as
torchtitan lays them out, 3 steps, and the full parameters equal the same plain tensors stepped in
one process:
  hsdp     (Replicate(), Shard(d)) on a ("dp", "fs") mesh, distributed_mesh the 2-D mesh;
  fsdp_tp  (Shard(0), Shard(1)) and (Shard(1), Shard(0)) on ("fs", "tp"), vectors (Shard(0),
           Replicate()); no distributed_mesh (the groups come from the parameters);
  experts  expert stacks [4, 96, 32] and [4, 32, 96] sharded Shard(0) over "ep" and then by FSDP2
           itself (fully_shard(..., mesh=efsdp, shard_placement_fn=lambda p: Shard(0))) on
           ("efsdp", "ep"): placements (_StridedShard(0, sf=2), Shard(0)), one whole expert per
           rank (the rank at (f, e) holds expert e * 2 + f), next to dense matrices FSDP-sharded over
           a 1-D mesh of all 4 ranks; also HSDP of the experts: (Replicate(), _StridedShard(0),
           Shard(0)) on ("dp_replicate", "efsdp", "ep") (the replicate dim of one rank here);
  expert_shards  torchtitan's other EP x FSDP, shard_placement_fn Shard(1): (Shard(1), Shard(0))
           on ("efsdp", "ep"), each EP rank's experts assembled over "efsdp" (Muon, NorMuon;
           Dion2 on tall stacks, whose columns it selects across the row shards);
  and at 2 ranks: FSDP without distributed_mesh, the same meshes with a dim of one rank.
Equal means: the matrices bit for bit for Muon and Dion2 (whole matrices are assembled exactly and the same
kernels run on them); NorMuon and Dion3 within RTOL relative to the largest element: they sum
each neuron's squared norms over the shards of a matrix (Dion3 also its selection norms), whose
float32 sums round differently from one process's (measured: 1.2e-7 absolute on elements of
about 1).
A state_dict() of the EP x FSDP stacks (DTensor state of FSDP2's strided placements) loads into
a fresh optimizer and the next step is bit-identical (experts_checkpoint_*).
Refusals (errors): Partial, experts split unevenly (both EP x FSDP variants, built with
fully_shard), two outer groups, a matrix dim sharded twice, TP-only sharding, a sharded
parameter added after construction to an optimizer without its group: every
rank raises, with the parameter's shape, its placements and what works. describe(): one row per
parameter with its name, algorithm, placement and how it is orthogonalized.

How: one 4-process and one 2-process Gloo job (spawn_job.run_job) run every case and report
{case: (ok, detail)} per rank.
"""

import pytest
import torch
import torch.distributed as dist

import dion_cpp
from spawn_job import check_case, run_cases, run_job

STEPS = 3
JOB_TIMEOUT_S = 150
GROUP_TIMEOUT_S = 60
RTOL = 1e-6
EXACT = ("muon", "dion2")

CLASSES = {
    "muon": (dion_cpp.Muon, {}),
    "normuon": (dion_cpp.NorMuon, {}),
    "dion2": (dion_cpp.Dion2, {"fraction": 0.5, "selection_scope": "global"}),
    "dion3": (dion_cpp.Dion3, {"fraction": 0.5, "selection_scope": "global"}),
}

DENSE = [(32, 48), (48, 32), (31, 20)]  # rows 31: uneven shards (16 + 15)
VECTOR = (20,)
EXPERTS = [(4, 96, 32), (4, 32, 96)]


def tensors(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def train(name, params, grads_of, n_matrices, split_first=None, **mesh):
    """STEPS steps; params[:n_matrices] in the class's group, the rest in an AdamW group;
    `split_first`: the first matrix alone in a group of those split_sizes."""
    cls, kwargs = CLASSES[name]
    groups = [{"params": params[:n_matrices]}, {"params": params[n_matrices:], "algorithm": "adamw"}]
    if split_first:
        groups = [{"params": params[:1], "split_sizes": split_first}, {"params": params[1:n_matrices]}, groups[1]]
    opt = cls(groups, lr=0.02, weight_decay=0.01, **kwargs, **mesh)
    for step in range(STEPS):
        for p, g in zip(params, grads_of(step)):
            p.grad = g
        opt.step()
    return opt


def compare(name, got, want, n_matrices):
    """(ok, detail): the matrices (got[:n_matrices]) bit for bit for EXACT, else within RTOL of
    the largest element; the AdamW vectors within RTOL (ATen's element-wise kernels round an
    element of a vectorized loop body and one of its scalar tail differently, so a shard of 10
    and the whole vector of 20 differ in the last bit: one process shows it too)."""
    diffs = [(g - w).abs().max().item() for g, w in zip(got, want)]
    scale = max(w.abs().max().item() for w in want)
    rel = max(diffs) / scale
    if name in EXACT:
        ok = all(torch.equal(g, w) for g, w in zip(got[:n_matrices], want[:n_matrices])) and rel <= RTOL
        return ok, f"max |diff| per parameter {diffs} (matrices: want bit-identical; vectors: RTOL {RTOL})"
    return rel <= RTOL, f"max |diff| per parameter {diffs}, relative {rel:.3g} (RTOL {RTOL})"


def full_of(t):
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t.detach()


def case_dense(name, layout, mesh_shape):
    """Dense matrices and a vector as DTensors of `layout` ("hsdp" or "fsdp_tp") on a 2-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    shapes = DENSE + [VECTOR]
    want = tensors(shapes, 0)
    train(name, want, lambda step: tensors(shapes, 100 + step), len(DENSE))
    if layout == "hsdp":
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "fs"))
        placements = [[Replicate(), Shard(0)], [Replicate(), Shard(1)], [Replicate(), Shard(0)],
                      [Replicate(), Shard(0)]]
        kw = {"distributed_mesh": mesh}
    else:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("fs", "tp"))
        placements = [[Shard(0), Shard(1)], [Shard(1), Shard(0)], [Shard(0), Shard(1)], [Shard(0), Replicate()]]
        kw = {}

    def place(ts):
        return [distribute_tensor(t, mesh, pl) for t, pl in zip(ts, placements)]

    params = [torch.nn.Parameter(t) for t in place(tensors(shapes, 0))]
    train(name, params, lambda step: place(tensors(shapes, 100 + step)), len(DENSE), **kw)
    return compare(name, [full_of(p) for p in params], want, len(DENSE))


def case_fsdp_no_mesh(name):
    """Shard(0) / Shard(1) over a 1-D mesh without distributed_mesh: the group is the mesh's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    shapes = DENSE + [VECTOR]
    want = tensors(shapes, 0)
    train(name, want, lambda step: tensors(shapes, 100 + step), len(DENSE))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fs",))
    placements = [[Shard(0)], [Shard(1)], [Shard(0)], [Shard(0)]]

    def place(ts):
        return [distribute_tensor(t, mesh, pl) for t, pl in zip(ts, placements)]

    params = [torch.nn.Parameter(t) for t in place(tensors(shapes, 0))]
    opt = train(name, params, lambda step: place(tensors(shapes, 100 + step)), len(DENSE))
    ok, detail = compare(name, [full_of(p) for p in params], want, len(DENSE))
    return ok and opt._group is not None, detail + f"; distributed over the mesh: {opt._group is not None}"


class Experts(torch.nn.Module):
    def __init__(self, stacks):
        super().__init__()
        self.w1 = torch.nn.Parameter(stacks[0].clone())
        self.w2 = torch.nn.Parameter(stacks[1].clone())


def expert_stacks(stacks, mesh, placement_dim=0):
    """torchtitan's EP x FSDP: each stack Shard(0) over mesh["ep"], then fully_shard over
    mesh["efsdp"] (HSDP: mesh["dp_replicate", "efsdp"]) with shard_placement_fn
    Shard(placement_dim): FSDP2's own placements."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    module = Experts(stacks)
    for key in ("w1", "w2"):
        setattr(module, key, torch.nn.Parameter(distribute_tensor(getattr(module, key).data, mesh["ep"], [Shard(0)])))
    fsdp_mesh = mesh["dp_replicate", "efsdp"] if "dp_replicate" in mesh.mesh_dim_names else mesh["efsdp"]
    fully_shard(module, mesh=fsdp_mesh, shard_placement_fn=lambda p: Shard(placement_dim))
    return [module.w1, module.w2]


def held_experts(local, full):
    """The indices of the experts of `full` that `local` holds (by value)."""
    return [e for e in range(full.shape[0]) for i in range(local.shape[0]) if torch.equal(local[i], full[e])]


def case_experts(name, mesh_shape):
    """Expert stacks (FSDP2's placements on ("efsdp", "ep")) and dense matrices Shard(0) over a
    1-D mesh of every rank, against one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    world = dist.get_world_size()
    shapes = EXPERTS + DENSE[:2] + [VECTOR]
    want = tensors(shapes, 0)
    want_opt = train(name, want, lambda step: tensors(shapes, 100 + step), len(shapes) - 1)
    names = ("dp_replicate", "efsdp", "ep")[-len(mesh_shape):]  # 3 dims: HSDP of the experts
    emesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    dmesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    start = tensors(shapes, 0)
    stacks = expert_stacks(start[:2], emesh)
    dense = [torch.nn.Parameter(distribute_tensor(t, dmesh, [Shard(0)])) for t in start[2:]]
    params = stacks + dense

    def grads(step):
        full = tensors(shapes, 100 + step)
        out = []
        for p, g in zip(stacks, full[:2]):  # this rank's experts of the full gradient, as FSDP2 leaves them
            local = g[held[id(p)]] if held[id(p)] else g[:0]
            out.append(DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                          shape=p.shape, stride=p.stride()))
        return out + [distribute_tensor(g, dmesh, [Shard(0)]) for g in full[2:]]

    held = {id(p): held_experts(p._local_tensor, w) for p, w in zip(stacks, start)}
    f, e = emesh.get_coordinate()[-2:]
    F = mesh_shape[-2]
    per_rank = EXPERTS[0][0] // world
    expected = [(e * F + f) * per_rank + i for i in range(per_rank)]  # strided: e-major
    layout_ok = all(held[id(p)] == expected for p in stacks)
    opt = train(name, params, grads, len(shapes) - 1)
    ok, detail = compare(name, [full_of(p) for p in params], want, len(shapes) - 1)
    m = opt.state[stacks[0]]["momentum"]
    state_ok = (isinstance(m, DTensor) and m.placements == stacks[0].placements
                and torch.equal(m.full_tensor(), want_opt.state[want[0]]["momentum"]))
    # Over their own group (shard_over) when split over both mesh dims; with a mesh dim of one
    # rank, a Shard(0) over the other, which is the dense matrices' outer group here: FSDP's.
    over = len(opt._expert_groups) == 2 if 1 not in mesh_shape[-2:] else len(opt._expert_groups) in (0, 2)
    placements = repr(tuple(stacks[0].placements))
    return (ok and layout_ok and state_ok and over,
            f"{detail}; placements {placements}; held experts {held[id(stacks[0])]} (want {expected}); "
            f"expert momentum a DTensor equal to one process's: {state_ok}; over their own group: {over}")


def case_expert_shards(name, stack_shapes=EXPERTS):
    """torchtitan's other EP x FSDP: fully_shard(..., shard_placement_fn=lambda p: Shard(1)) on
    stacks Shard(0) over "ep": (Shard(1), Shard(0)) on ("efsdp", "ep"), each rank half the rows
    of its EP rank's experts, assembled over "efsdp"; dense matrices FSDP-sharded beside them.
    Dion2 on tall stacks only: it selects their columns, across the row shards (one process's
    selection); along the sharded rows (wide stacks, and NorDion2 / Dion3 always) 3-D stacks take
    the assembled global scope of 1-D FSDP, which is not one process's (docs/distributed.md)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    world = dist.get_world_size()
    shapes = list(stack_shapes) + DENSE[:2] + [VECTOR]
    want = tensors(shapes, 0)
    want_opt = train(name, want, lambda step: tensors(shapes, 100 + step), len(shapes) - 1)
    emesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("efsdp", "ep"))
    dmesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    start = tensors(shapes, 0)
    stacks = expert_stacks(start[:2], emesh, placement_dim=1)
    params = stacks + [torch.nn.Parameter(distribute_tensor(t, dmesh, [Shard(0)])) for t in start[2:]]

    def grads(step):
        full = tensors(shapes, 100 + step)
        return ([distribute_tensor(g, p.device_mesh, p.placements) for p, g in zip(stacks, full[:2])]
                + [distribute_tensor(g, dmesh, [Shard(0)]) for g in full[2:]])

    opt = train(name, params, grads, len(shapes) - 1)
    ok, detail = compare(name, [full_of(p) for p in params], want, len(shapes) - 1)
    m = opt.state[stacks[0]]["momentum"]
    state_ok = (m.placements == stacks[0].placements
                and (m.full_tensor() - want_opt.state[want[0]]["momentum"]).abs().max().item() <= RTOL)
    placements = repr(tuple(stacks[0].placements))
    return ok and state_ok, f"{detail}; placements {placements}; expert momentum equal to one process's: {state_ok}"


class TpBlock(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.colwise = torch.nn.Parameter(weights[0].clone())  # [out, in], TP on the rows
        self.rowwise = torch.nn.Parameter(weights[1].clone())  # [out, in], TP on the columns
        self.bias = torch.nn.Parameter(weights[2].clone())  # the column-parallel bias, TP on dim 0


def case_fsdp_over_tp(name, split=None):
    """torchtitan's FSDP x TP: a column-parallel weight Shard(0) and a row-parallel one Shard(1)
    over "tp", then fully_shard over "fs" (FSDP2's default Shard(0)): (_StridedShard(0, sf=2),
    Shard(0)) — the rows split over both mesh dims, chunk t * 2 + f on the rank at (f, t) — and
    (Shard(0), Shard(1)); the column-parallel bias strided as its weight (AdamW). Orthogonalization does not
    see a permutation of the rows but for rounding; `split` (split_sizes of the column-parallel
    weight: blocks of rows, a fused QKV) does: the rows must be assembled in one process's order
    (the group in chunk order, the bindings' OrderedAxis), not the ProcessGroup's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    shapes = [(32, 48), (48, 32), VECTOR]
    want = tensors(shapes, 0)
    train(name, want, lambda step: tensors(shapes, 100 + step), 2, split)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fs", "tp"))
    block = TpBlock(tensors(shapes, 0))
    block.colwise = torch.nn.Parameter(distribute_tensor(block.colwise.data, mesh["tp"], [Shard(0)]))
    block.rowwise = torch.nn.Parameter(distribute_tensor(block.rowwise.data, mesh["tp"], [Shard(1)]))
    block.bias = torch.nn.Parameter(distribute_tensor(block.bias.data, mesh["tp"], [Shard(0)]))
    fully_shard(block, mesh=mesh["fs"])
    params = [block.colwise, block.rowwise, block.bias]
    f, t = mesh.get_coordinate()
    chunk = t * 2 + f

    def strided(full, p):  # this rank's chunk t * 2 + f of dim 0, as FSDP2 leaves the gradient
        n = full.shape[0] // 4
        return DTensor.from_local(full[chunk * n:(chunk + 1) * n], p.device_mesh, p.placements,
                                  run_check=False, shape=p.shape, stride=p.stride())

    def grads(step):
        full = tensors(shapes, 100 + step)
        return [strided(full[0], block.colwise),
                distribute_tensor(full[1], block.rowwise.device_mesh, block.rowwise.placements),
                strided(full[2], block.bias)]

    rows = shapes[0][0] // 4

    held = torch.equal(block.colwise._local_tensor, tensors(shapes, 0)[0][chunk * rows:(chunk + 1) * rows])
    train(name, params, grads, 2, split)
    ok, detail = compare(name, [full_of(p) for p in params], want, 2)
    placements = [repr(tuple(p.placements)) for p in params]
    return ok and held, f"{detail}; placements {placements}; the rank at (f, t) held rows chunk t * 2 + f: {held}"


def case_experts_checkpoint(name):
    """state_dict() of an optimizer over EP x FSDP expert stacks (DTensor state of FSDP2's
    strided placements) loads into a fresh one over copies, and both take the next step
    bit-identically."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    emesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("efsdp", "ep"))
    start = tensors(EXPERTS, 0)
    cls, kwargs = CLASSES[name]

    def local_grads(stacks, step):
        out = []
        for p, g in zip(stacks, tensors(EXPERTS, 100 + step)):
            mine = held_experts(p._local_tensor, p.full_tensor())
            out.append(DTensor.from_local(g[mine], p.device_mesh, p.placements, run_check=False,
                                          shape=p.shape, stride=p.stride()))
        return out

    stacks = expert_stacks(start, emesh)
    opt = cls(stacks, lr=0.02, **kwargs)
    for step in range(STEPS):
        for p, g in zip(stacks, local_grads(stacks, step)):
            p.grad = g
        opt.step()
    copies = expert_stacks([p.full_tensor() for p in stacks], emesh)
    fresh = cls(copies, lr=0.02, **kwargs)
    fresh.load_state_dict(opt.state_dict())
    for o, ps in ((opt, stacks), (fresh, copies)):
        for p, g in zip(ps, local_grads(ps, STEPS)):
            p.grad = g
        o.step()
    same = all(torch.equal(a._local_tensor, b._local_tensor) for a, b in zip(stacks, copies))
    return same, "the next step after load_state_dict is bit-identical" if same else "differs"


def expect_error(make, error, *texts):
    """None when make() raises `error` whose message contains every text, else what went wrong."""
    try:
        make()
    except error as e:
        missing = [t for t in texts if t not in str(e)]
        return None if not missing else f"message lacks {missing}: {e}"
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__} instead of {error.__name__}: {e}"
    return f"no {error.__name__} raised"


def case_refusals():
    """What is not supported raises on every rank, before any collective, naming the parameter's
    shape, its placements and what works."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    works = "what works:"
    emesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("efsdp", "ep"))
    fs_tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fs", "tp"))

    def muon(*params, **kw):
        return dion_cpp.Muon([torch.nn.Parameter(p) if not isinstance(p, torch.nn.Parameter) else p
                              for p in params], lr=0.02, **kw)

    partial = DTensor.from_local(torch.randn(8, 16), fs_tp, [Shard(0), Partial()], run_check=False)
    shard1 = expert_stacks(tensors([(3, 96, 32), (3, 32, 96)], 0), emesh, placement_dim=1)[0]
    uneven = expert_stacks(tensors([(2, 96, 32), (2, 32, 96)], 0), emesh)[0]
    a = distribute_tensor(torch.randn(8, 16), fs_tp, [Shard(0), Replicate()])
    b = distribute_tensor(torch.randn(8, 16), fs_tp, [Replicate(), Shard(0)])
    twice = distribute_tensor(torch.randn(6, 16), fs_tp, [Shard(0), Shard(0)])
    both = distribute_tensor(torch.randn(8, 16), fs_tp, [Shard(0), Shard(1)])
    dmesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",))
    everyone = distribute_tensor(torch.randn(8, 16), dmesh, [Shard(0)])
    checks = {
        "partial": expect_error(lambda: muon(partial), ValueError, "shape [16, 16]", "Partial()",
                                "Partial() parameters are not supported", works),
        "experts Shard(1) over efsdp, uneven over ep": expect_error(
            lambda: muon(shard1), NotImplementedError, "shape [3, 96, 32]", "(Shard(dim=1), Shard(dim=0))",
            "its 3 experts (dim 0) are split over 2 ranks ('ep') unevenly", works),
        "experts uneven": expect_error(
            lambda: muon(uneven), NotImplementedError, "shape [2, 96, 32]", "_StridedShard(dim=0, sf=2)",
            "unevenly", "dim 0 divisible by 4", works),
        "two outer groups": expect_error(
            lambda: muon(a, b), NotImplementedError, "shape [8, 16]", "(Shard(dim=0), Replicate())",
            "(Replicate(), Shard(dim=0))", "mesh dim 'fs'", "mesh dim 'tp'", "own optimizer"),
        "matrix dim split over two mesh dims unevenly": expect_error(
            lambda: muon(twice), NotImplementedError, "shape [6, 16]", "(Shard(dim=0), Shard(dim=0))",
            "its dim 0 (6) is split over 4 ranks ('fs' x 'tp') unevenly", works),
        "TP only next to FSDP and FSDP x TP": expect_error(
            lambda: muon(a, both, b), NotImplementedError, "(Replicate(), Shard(dim=0))", "inner (TP) group only",
            works),
        "N-D distributed_mesh of other dims": expect_error(
            lambda: muon(everyone, distributed_mesh=emesh), ValueError, "no dim of distributed_mesh",
            "DeviceMesh(efsdp=2, ep=2)", "DeviceMesh(dp_shard=4)"),
    }

    def add_late():
        opt = muon(torch.randn(8, 8))  # no distribution: nothing sharded at construction
        opt.add_param_group({"params": [torch.nn.Parameter(a)]})

    checks["sharded parameter added after construction"] = expect_error(
        add_late, NotImplementedError, "parameter of param group 1", "(added after construction)",
        "mesh dim 'fs'", "pass every parameter at construction")
    bad = {k: v for k, v in checks.items() if v is not None}
    return not bad, str(bad) if bad else "ok"


def case_describe():
    """describe(): one row per parameter, named from named_parameters, with its layout and how
    it is orthogonalized; a matrix in the AdamW group shows as element-wise."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    world = dist.get_world_size()
    emesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("efsdp", "ep"))
    fs_tp = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("fs", "tp"))
    stacks = expert_stacks(tensors(EXPERTS, 0), emesh)
    dense = torch.nn.Parameter(distribute_tensor(torch.randn(32, 48), fs_tp, [Shard(0), Shard(1)]))
    heads = torch.nn.Parameter(distribute_tensor(torch.randn(32, 48), fs_tp, [Shard(0), Shard(1)]))
    stray = torch.nn.Parameter(distribute_tensor(torch.randn(16, 48), fs_tp, [Shard(0), Shard(1)]))
    opt = dion_cpp.Dion2([{"params": stacks + [dense]}, {"params": [heads], "num_heads": 4},
                          {"params": [stray], "algorithm": "adamw"}],
                         lr=0.02, fraction=0.5, selection_scope="global")
    names = {"experts.w1": stacks[0], "experts.w2": stacks[1], "attn.wq": dense, "attn.wk": heads}
    table = opt.describe(names)
    text = str(table)
    rows = list(table)
    wants = {
        "named": [r["name"] for r in rows] == ["experts.w1", "experts.w2", "attn.wq", "attn.wk",
                                                "param_groups[2][0]"],
        "algorithms": [r["algorithm"] for r in rows] == ["dion2"] * 4 + ["adamw"],
        "expert layout": "experts over 'efsdp' x 'ep'" in rows[0]["layout"],
        "expert ortho": rows[0]["orthogonalized"].startswith("4 experts"),
        "2-D layout": "Shard(0) over 'fs', Shard(1) over 'tp'" in rows[2]["layout"],
        "dion2 scope": "selection_scope=global" in rows[2]["orthogonalized"],
        "heads": "num_heads=4" in rows[3]["orthogonalized"],
        "element-wise": rows[4]["orthogonalized"].startswith("element-wise"),
        "printed": "experts.w1" in text and "adamw" in text and "[4, 96, 32]" in text,
    }
    bad = [k for k, v in wants.items() if not v]
    return not bad, f"failed: {bad}\n{text}" if bad else "ok"


CASES4 = {
    **{f"hsdp_{k}": (lambda k=k: case_dense(k, "hsdp", (2, 2))) for k in CLASSES},
    **{f"fsdp_tp_{k}": (lambda k=k: case_dense(k, "fsdp_tp", (2, 2))) for k in CLASSES},
    **{f"experts_{k}": (lambda k=k: case_experts(k, (2, 2))) for k in CLASSES},
    # HSDP of the experts (fully_shard over ("dp_replicate", "efsdp")): (Replicate(),
    # _StridedShard(0), Shard(0)) on a 3-D mesh, the stacks over its last two dims.
    **{f"experts_hsdp_{k}": (lambda k=k: case_experts(k, (1, 2, 2))) for k in ("muon", "dion3")},
    **{f"expert_shards_{k}": (lambda k=k: case_expert_shards(k)) for k in ("muon", "normuon")},
    "expert_shards_dion2_tall": lambda: case_expert_shards("dion2", [(4, 96, 32), (4, 64, 32)]),
    **{f"fsdp_over_tp_{k}": (lambda k=k: case_fsdp_over_tp(k)) for k in CLASSES},
    "fsdp_over_tp_muon_split_sizes": lambda: case_fsdp_over_tp("muon", (16, 16)),
    **{f"experts_checkpoint_{k}": (lambda k=k: case_experts_checkpoint(k)) for k in ("normuon", "dion3")},
    "refusals": case_refusals,
    "describe": case_describe,
}
CASES2 = {
    **{f"fsdp_no_mesh_{k}": (lambda k=k: case_fsdp_no_mesh(k)) for k in ("muon", "dion3")},
    # Mesh dims of one rank are ignored: HSDP with one shard (DDP over the whole mesh), TP only.
    **{f"hsdp_2x1_{k}": (lambda k=k: case_dense(k, "hsdp", (2, 1))) for k in ("muon", "normuon")},
    **{f"fsdp_tp_1x2_{k}": (lambda k=k: case_dense(k, "fsdp_tp", (1, 2))) for k in ("dion2", "dion3")},
    **{f"experts_2x1_{k}": (lambda k=k: case_experts(k, (2, 1))) for k in ("muon", "dion2")},
    **{f"experts_1x2_{k}": (lambda k=k: case_experts(k, (1, 2))) for k in ("normuon", "dion3")},
}
JOBS = {4: CASES4, 2: CASES2}


def _worker(rank, world, port, report):
    torch.set_num_threads(1)  # up to twice as many ranks as the test machine has cores
    run_cases(rank, world, port, report, JOBS[world], GROUP_TIMEOUT_S)


@pytest.fixture(scope="module")
def report4():
    return run_job(_worker, 4, 4, JOB_TIMEOUT_S, "the 4-process placements job", join_timeout_s=5)


@pytest.fixture(scope="module")
def report2():
    return run_job(_worker, 2, 2, JOB_TIMEOUT_S, "the 2-process placements job", join_timeout_s=5)


check = check_case


@pytest.mark.parametrize("case", list(CASES4))
def test_four_processes(report4, case):
    check(report4, 4, case)


@pytest.mark.parametrize("case", list(CASES2))
def test_two_processes(report2, case):
    check(report2, 2, case)
