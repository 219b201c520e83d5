"""Replicas cannot drift apart silently: 2 processes (Gloo on 127.0.0.1) whose optimizers differ.

What it checks (python/dion_cpp/_checks.py, ReplicaCheck; docs/optimizers.md, "Python module"):
with torch.distributed initialized, every step checks that every rank has the same options
(lr, weight_decay, mu, betas, epsilon, nesterov, the algorithm, step counts, parameter shapes
and dtypes), with one small all_reduce of a hash. A difference raises ValueError on EVERY rank,
naming the group, the key and each rank's value: at the first step (lr, nesterov, a shape) and
later (group["lr"] edited on one rank only, as a per-rank scheduler would), both with a
distributed_mesh (the optimizer's DDP) and without one (plain DDP: the default group is checked).
Equal options pass and keep the replicas bit-identical; replica_check = False turns the check off
(ranks that hold different parameters on purpose). A rank that does not step makes its peer
raise RuntimeError after replica_check_timeout instead of hanging (a job of its own: the timed-out
collective stays pending in Gloo).

How: as test_distributed.py, one spawned 2-process job per case list reports
{case: (ok, detail)} per rank through a queue; a job is killed if it exceeds JOB_TIMEOUT_S.
"""
import datetime
import os
import re
import traceback

import pytest
import torch
import torch.distributed as dist

import dion_cpp
from spawn_job import check_case, free_port, run_job

WORLD = 2
JOB_TIMEOUT_S = 150
GROUP_TIMEOUT_S = 60


def params(seed=0, shapes=((16, 8), (8, 8))):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def steps(opt, ps, n, seed=100):
    for s in range(n):
        g = torch.Generator().manual_seed(seed + s)  # the same gradients on every rank (DDP)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def expect_disagreement(run, words):
    """(ok, detail): run() raises ValueError whose message contains every regex in `words`."""
    try:
        run()
    except ValueError as e:
        msg = str(e)
        missing = [w for w in words if not re.search(w, msg)]
        return not missing, msg if missing else "ok"
    return False, "no error: the ranks' different options were not noticed"


def mesh_kw(use_mesh):
    return {"distributed_mesh": dist.group.WORLD} if use_mesh else {}


def case_lr_differs(use_mesh):
    rank = dist.get_rank()
    ps = params()
    opt = dion_cpp.Muon(ps, lr=0.01 if rank == 0 else 0.02, **mesh_kw(use_mesh))
    return expect_disagreement(lambda: steps(opt, ps, 1), [
        r"param group 0, 'lr': rank 0 has 0\.01, rank 1 has 0\.02\.",
        r"Replicated parameters would drift apart"])


def case_lr_edited_later_on_one_rank(use_mesh):
    rank = dist.get_rank()
    ps = params()
    opt = dion_cpp.NorMuon(ps, lr=0.01, **mesh_kw(use_mesh))
    steps(opt, ps, 2)  # equal so far: no error

    def edit_and_step():
        if rank == 1:
            opt.param_groups[0]["lr"] = 0.5
        steps(opt, ps, 1, seed=200)
    return expect_disagreement(edit_and_step, [r"param group 0, 'lr': rank 0 has 0\.01, rank 1 has 0\.5\."])


def case_nesterov_differs():
    rank = dist.get_rank()
    ps = params()
    opt = dion_cpp.Muon(ps, nesterov=rank == 1, distributed_mesh=dist.group.WORLD)
    return expect_disagreement(lambda: steps(opt, ps, 1),
                               [r"param group 0, 'nesterov': rank 0 has False, rank 1 has True"])


def case_adamw_group_weight_decay_differs():
    rank = dist.get_rank()
    m, v = params(shapes=((16, 8), (8,)))
    opt = dion_cpp.Dion2([{"params": [m]}, {"params": [v], "algorithm": "adamw",
                                             "weight_decay": 0.0 if rank == 0 else 0.1}])
    return expect_disagreement(lambda: steps(opt, [m, v], 1),
                               [r"param group 1, 'weight_decay': rank 0 has 0\.0, rank 1 has 0\.1\."])


def case_shape_differs():
    rank = dist.get_rank()
    ps = params(shapes=((16, 8), (8, 8) if rank == 0 else (8, 4)))
    opt = dion_cpp.Muon(ps)
    return expect_disagreement(lambda: steps(opt, ps, 1), [
        r"param group 0, parameter 1, 'shape and dtype': rank 0 has \(\(8, 8\), 'torch\.float32'\), "
        r"rank 1 has \(\(8, 4\), 'torch\.float32'\)\."])


def case_equal_options_pass_and_stay_identical():
    ps = params()
    opt = dion_cpp.Muon(ps, lr=0.02, distributed_mesh=dist.group.WORLD)
    steps(opt, ps, 3)
    plain_ps = params(seed=1)
    plain = dion_cpp.NorDion2(plain_ps, lr=0.02)  # plain DDP: checked over the default group
    steps(plain, plain_ps, 3)
    flat = torch.cat([p.detach().reshape(-1) for p in ps + plain_ps])
    every = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(every, flat)
    same = all(torch.equal(every[0], t) for t in every)
    return same, "ok" if same else "replicas differ although every rank had the same options"


def case_check_off_for_different_parameters():
    """Pipeline stages: different parameters per rank on purpose; replica_check = False."""
    rank = dist.get_rank()
    ps = params(shapes=((16, 8),) if rank == 0 else ((4, 4), (4, 8)))
    opt = dion_cpp.Muon(ps, lr=0.01 * (rank + 1))
    opt.replica_check = False
    steps(opt, ps, 2)
    return True, "ok"


def case_only_one_rank_steps():
    rank = dist.get_rank()
    ps = params()
    opt = dion_cpp.Muon(ps)
    opt.replica_check_timeout = 3
    if rank == 1:
        return True, "ok (this rank does not step)"
    try:
        steps(opt, ps, 1)
    except RuntimeError as e:
        ok = "did not step within 3 s" in str(e)
        return ok, str(e)
    return False, "no error although the other rank never stepped"


def case_check_passes_no_python_tensor_to_gloo():
    """The replica check's collective never takes a Python tensor (it runs in _C.all_reduce_max):
    Gloo's worker thread drops a finished work's tensors after wait() returns, and dropping the
    last reference to a Python tensor there at interpreter exit aborts the process. The check
    still runs (it sees a difference made after the spied steps)."""
    ps = params()
    opt = dion_cpp.Muon(ps, distributed_mesh=dist.group.WORLD)
    seen = []
    real = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "broadcast", "all_gather_object")}

    def spy(name):
        def call(*args, **kwargs):
            seen.append(name)
            return real[name](*args, **kwargs)
        return call
    for name in real:
        setattr(dist, name, spy(name))
    try:
        steps(opt, ps, 2)
    finally:
        for name, f in real.items():
            setattr(dist, name, f)
    if seen:
        return False, f"the replica check called torch.distributed with Python tensors: {seen}"
    if dist.get_rank() == 1:
        opt.param_groups[0]["lr"] = 0.5
    return expect_disagreement(lambda: steps(opt, ps, 1, seed=300), [r"'lr': rank 0 has 0\.01, rank 1 has 0\.5\."])


CASES = {
    "lr_differs_with_mesh": lambda: case_lr_differs(True),
    "lr_differs_plain_ddp": lambda: case_lr_differs(False),
    "lr_edited_later_with_mesh": lambda: case_lr_edited_later_on_one_rank(True),
    "lr_edited_later_plain_ddp": lambda: case_lr_edited_later_on_one_rank(False),
    "nesterov_differs": case_nesterov_differs,
    "adamw_weight_decay_differs": case_adamw_group_weight_decay_differs,
    "shape_differs": case_shape_differs,
    "equal_options_pass": case_equal_options_pass_and_stay_identical,
    "check_off": case_check_off_for_different_parameters,
    "check_passes_no_python_tensor": case_check_passes_no_python_tensor_to_gloo,
}
JOBS = {"main": CASES, "one_rank_steps": {"only_one_rank_steps": case_only_one_rank_steps}}


def _worker(rank, job, port, report):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    results = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        for name, run in JOBS[job].items():
            try:
                results[name] = run()
            except Exception:  # noqa: BLE001  (reported per case)
                results[name] = (False, traceback.format_exc())
    except Exception:  # noqa: BLE001
        results["setup"] = (False, traceback.format_exc())
    report.put((rank, results))
    report.close()
    report.join_thread()  # the report is sent before the process leaves
    # A timed-out collective may still be pending in Gloo (one_rank_steps): leave without
    # running any destructor that could wait for it.
    os._exit(0)


def _run_job(job):
    return run_job(_worker, WORLD, job, JOB_TIMEOUT_S, f"the job {job!r}")


@pytest.fixture(scope="module")
def report():
    return _run_job("main")


def check(report, case):
    check_case(report, WORLD, case)


@pytest.mark.parametrize("case", list(CASES))
def test_replicas(report, case):
    check(report, case)


def test_a_rank_that_does_not_step_makes_the_other_raise_instead_of_hanging():
    check(_run_job("one_rank_steps"), "only_one_rank_steps")


# ---------------------------------------------------------------------------- exit
EXIT_SCRIPT = r'''
import atexit, datetime, gc, os, sys
import torch, torch.distributed as dist

rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
keep = {}


@atexit.register  # registered before dion_cpp's handler: runs after it
def _after_dion_cpp():
    try:
        keep["opt"]._cpp.group_step(0)
        print("NOT RELEASED", flush=True)
    except ValueError as e:
        print("RELEASED:", e, flush=True)


import dion_cpp  # noqa: E402

ps = [torch.nn.Parameter(torch.randn(16, 8)) for _ in range(3)]
opt = dion_cpp.NorMuon(ps, distributed_mesh=dist.group.WORLD)
for s in range(2):
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
opt.cycle = opt  # alive at exit, in a reference cycle the collector is told not to collect
keep["opt"] = opt
gc.disable()
'''


def test_distributed_optimizer_alive_at_exit_is_released_and_exits_cleanly(tmp_path):
    """Both ranks leave with a distributed optimizer alive (no destroy_process_group): the module's
    atexit handler releases its C++ side (and so its ProcessGroup references) before the
    interpreter's teardown, and both exit with status 0 and nothing on stderr."""
    import subprocess
    import sys

    script = tmp_path / "exit_alive.py"
    script.write_text(EXIT_SCRIPT)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank did not exit within the job timeout")
        outs.append((p.returncode, out, err))
    for rank, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {rank} exited with {rc}: {err[-2000:]}"
        assert "RELEASED: this dion_cpp optimizer was released at interpreter exit" in out, (rank, out, err)
        assert "NOT RELEASED" not in out
        # The one line this job may print: on a CPU without native bf16 GEMMs where the library
        # cannot reproduce ATen's bf16 loops either (no AVX2: dion/math/bf16_matmul_cpu.h) the exact
        # path warns once (ortho.cpp, note_slow_exact_dtype) that ATen runs them on its scalar fallback.
        err = "\n".join(line for line in err.splitlines()
                        if "dion: the exact orthogonalization computes in" not in line)
        assert err.strip() == "", f"rank {rank} wrote to stderr: {err[-2000:]}"
