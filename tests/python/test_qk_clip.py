"""QK-clip from Python (dion_cpp.QKClip): the clip after Muon's and Dion2's step on torchtitan's
layouts of the attention weights, at 2 and 4 ranks, equals one process bit for bit.

What it checks (python/dion_cpp/_qk_clip.py; docs/optimizers.md "QK-clip"): an attention layer's
wq [H * hd, d] and wk [Hkv * hd, d] (MHA and GQA; 8 heads: two a rank at 4 ranks) step 3 times: the optimizer's step, then the
largest pre-softmax logit of every head over a batch of sequences, then clip.apply. Each rank
computes the logits of its own sequences only (data parallel: the max over the ranks is the
batch's) from the full weights, one sequence at a time so that every logit is the same
computation in one process and on a rank; QKClip combines them (one all_gather) and each rank
scales its own rows. Layouts:
  fsdp      Shard(0) over a 1-D mesh of all ranks (2 ranks: a head split over both);
  fsdp_tp   wq (Shard(0), Shard(1)), wk (Shard(1), Shard(0)) on ("fs", "tp"): column shards hold
            every row;
  strided   FSDP2 over TP on the rows, (_StridedShard(0, sf=2), Shard(0)) on ("fs", "tp"): the
            rank at (f, t) holds row chunk t * 2 + f, not the chunk of its place in the group;
  hsdp      (Replicate(), Shard(0)) on ("dp", "fs").
Equal: the weights after every step and clip, bit for bit (Muon and Dion2 with
selection_scope="global" are bit-identical to one process on these layouts,
tests/python/test_placements.py; the clip multiplies rows by factors every rank computes from the
same maxima). The maxima returned equal one process's; some heads were clipped and some not.
Refusals: a Partial weight; maxima of the wrong length (every rank raises, nothing scaled).
"""

import pytest
import torch
import torch.distributed as dist

import dion_cpp
from spawn_job import check_case, run_cases, run_job

STEPS = 3
JOB_TIMEOUT_S = 120
GROUP_TIMEOUT_S = 60
D, HD, T, SEQS = 32, 8, 8, 8
CLASSES = {"muon": (dion_cpp.Muon, {}),
           "dion2": (dion_cpp.Dion2, {"fraction": 0.5, "selection_scope": "global"})}


def weights(h, hkv, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(h * HD, D, generator=g) * 0.5, torch.randn(hkv * HD, D, generator=g) * 0.5


def sequences():
    return torch.randn(SEQS, T, D, generator=torch.Generator().manual_seed(7)) * 2


def max_logits(wq, wk, seqs, h, hkv):
    """[h] largest causal q . k / sqrt(hd) over `seqs` (a list of [T, D]), one sequence at a time;
    -inf when there are none."""
    out = torch.full((h,), float("-inf"))
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for x in seqs:
        q = (x @ wq.t()).view(T, h, HD).transpose(0, 1)
        k = (x @ wk.t()).view(T, hkv, HD).transpose(0, 1).repeat_interleave(h // hkv, 0)
        s = (q @ k.transpose(1, 2)) / HD ** 0.5
        out = torch.maximum(out, s.masked_fill(mask, float("-inf")).flatten(1).amax(1))
    return out


def train(name, wq, wk, grads_of, seqs, h, hkv, tau, full=lambda t: t, **mesh):
    """STEPS of step + clip; returns the maxima of every step (the clip's return)."""
    cls, kwargs = CLASSES[name]
    opt = cls([{"params": [wq, wk]}], lr=0.05, weight_decay=0.0, **kwargs, **mesh)
    clip = dion_cpp.QKClip(tau, [(wq, wk, h, hkv)])
    seen = []
    for step in range(STEPS):
        wq.grad, wk.grad = grads_of(step)
        opt.step()
        seen.append(clip.apply([max_logits(full(wq), full(wk), seqs, h, hkv)]))
    return seen


def full_of(t):
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t.detach()


def case(name, layout, h, hkv):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    W, rank = dist.get_world_size(), dist.get_rank()
    seqs = sequences()
    grads = lambda step: weights(h, hkv, 100 + step)  # noqa: E731
    # tau: the median of one process's first maxima after a step, so that some heads are clipped
    q0, k0 = [torch.nn.Parameter(t) for t in weights(h, hkv, 0)]
    probe = max_logits(q0.detach() - 0.05 * grads(0)[0], k0.detach(), list(seqs), h, hkv)
    tau = float(probe.median())
    want_q, want_k = [torch.nn.Parameter(t) for t in weights(h, hkv, 0)]
    want_seen = train(name, want_q, want_k, grads, list(seqs), h, hkv, tau)

    if layout == "fsdp":
        mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("fs",))
        pq = pk = [Shard(0)]
    elif layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("fs", "tp"))
        pq, pk = [Shard(0), Shard(1)], [Shard(1), Shard(0)]
    elif layout == "strided":
        mesh = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("fs", "tp"))
        pq = pk = [_StridedShard(0, split_factor=W // 2), Shard(0)]
    else:
        mesh = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("dp", "fs"))
        pq = pk = [Replicate(), Shard(0)]

    def place(pair):
        return [distribute_tensor(t, mesh, pl, src_data_rank=None) for t, pl in zip(pair, (pq, pk))]

    wq, wk = [torch.nn.Parameter(t) for t in place(weights(h, hkv, 0))]
    mine = [seqs[i] for i in range(SEQS) if i % W == rank]  # this rank's sequences
    kw = {"distributed_mesh": mesh} if layout == "hsdp" else {}
    seen = train(name, wq, wk, lambda step: place(grads(step)), mine, h, hkv, tau, full_of, **kw)
    got_q, got_k = full_of(wq), full_of(wk)
    rows = [list(p._local_tensor.shape) for p in (wq, wk)]
    same = torch.equal(got_q, want_q.detach()) and torch.equal(got_k, want_k.detach())
    same_seen = all(torch.equal(a, b) for a, b in zip(seen, want_seen))
    S = torch.stack([s[0] for s in want_seen])
    clipped = bool((S > tau).any()) and bool((S <= tau).any())
    held = isinstance(wq, DTensor) and tuple(wq.placements) == tuple(pq)
    return (same and same_seen and clipped and held,
            f"weights equal: {same} (max |diff| {(got_q - want_q).abs().max().item():.3g}, "
            f"{(got_k - want_k).abs().max().item():.3g}); maxima equal: {same_seen}; some clipped, some not: "
            f"{clipped} (tau {tau:.4g}, maxima {S.tolist()}); placements {wq.placements}, local {rows}")


def case_refusals():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import Partial

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fs",))
    wq, wk = weights(2, 2, 0)
    partial = DTensor.from_local(wq, mesh, [Partial()], run_check=False)
    got = {}
    try:
        dion_cpp.QKClip(10.0, [(partial, wk, 2, 2)])
        got["partial"] = "accepted"
    except ValueError as e:
        got["partial"] = str(e)
    q, k = [distribute_tensor(t, mesh, [Shard(0)]) for t in (wq, wk)]
    clip = dion_cpp.QKClip(1e-3, [(q, k, 2, 2)])
    before = q._local_tensor.clone()
    try:
        clip.apply([torch.ones(3)])
        got["length"] = "accepted"
    except ValueError as e:
        got["length"] = str(e)
    ok = ("Partial" in got["partial"] and "full_tensor() or redistribute" in got["partial"]
          and "need one a query head (2)" in got["length"] and torch.equal(q._local_tensor, before))
    return ok, str(got)


CASES4 = {
    **{f"{layout}_{name}": (lambda layout=layout, name=name: case(name, layout, 8, 8))
       for layout in ("fsdp", "fsdp_tp", "strided", "hsdp") for name in CLASSES},
    "strided_gqa_muon": lambda: case("muon", "strided", 8, 4),
    "refusals": case_refusals,
}
CASES2 = {
    "fsdp_muon": lambda: case("muon", "fsdp", 4, 4),
    "fsdp_gqa_dion2": lambda: case("dion2", "fsdp", 2, 1),  # 2 ranks, 2 heads: rows of one head each
}
JOBS = {4: CASES4, 2: CASES2}


def _worker(rank, world, port, report):
    torch.set_num_threads(1)
    run_cases(rank, world, port, report, JOBS[world], GROUP_TIMEOUT_S)


@pytest.fixture(scope="module")
def report4():
    return run_job(_worker, 4, 4, JOB_TIMEOUT_S, "the 4-process QK-clip job", join_timeout_s=5)


@pytest.fixture(scope="module")
def report2():
    return run_job(_worker, 2, 2, JOB_TIMEOUT_S, "the 2-process QK-clip job", join_timeout_s=5)


@pytest.mark.parametrize("name", list(CASES4))
def test_four_processes(report4, name):
    check_case(report4, 4, name)


@pytest.mark.parametrize("name", list(CASES2))
def test_two_processes(report2, name):
    check_case(report2, 2, name)


def test_max_logits_helper_equals_the_scores_max():
    """QKClip.max_logits (q [B, H, T, D], k [B, Hkv, T, D], causal, in query blocks) equals the
    max of the whole masked score matrix, per head; MHA and GQA, blocks smaller than T."""
    g = torch.Generator().manual_seed(5)
    for h, hkv in ((4, 4), (4, 2)):
        q, k = torch.randn(2, h, 10, HD, generator=g), torch.randn(2, hkv, 10, HD, generator=g)
        s = (q @ k.repeat_interleave(h // hkv, 1).transpose(-1, -2)) / HD ** 0.5
        want = s.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf")).amax((0, 2, 3))
        got = dion_cpp.QKClip.max_logits(q, k, block=3)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), (got, want)
        assert torch.allclose(dion_cpp.QKClip.max_logits(q, k, causal=False), s.amax((0, 2, 3)), rtol=1e-6, atol=1e-6)


def test_one_process_mha_and_gqa_end_at_tau():
    """No torch.distributed: the clipped heads' largest logit on the same inputs is tau after the
    clip (float32 rounding), the others untouched bit for bit; GQA keeps wk."""
    for h, hkv in ((4, 4), (4, 2)):
        wq, wk = weights(h, hkv, 3)
        seqs = list(sequences())
        before = max_logits(wq, wk, seqs, h, hkv)
        tau = float(before.median())
        q0, k0 = wq.clone(), wk.clone()
        dion_cpp.QKClip(tau, [{"wq": wq, "wk": wk, "n_heads": h, "n_kv_heads": hkv, "name": "attn"}]).apply([before])
        after = max_logits(wq, wk, seqs, h, hkv)
        for i in range(h):
            rows = slice(i * HD, (i + 1) * HD)
            if before[i] > tau:
                assert abs(after[i].item() - tau) <= 1e-5 * tau, (h, hkv, i, after[i].item(), tau)
            else:
                assert torch.equal(wq[rows], q0[rows]), (h, hkv, i)
        if hkv < h:
            assert torch.equal(wk, k0)
