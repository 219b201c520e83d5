"""tests/multihost/test_multihost.py — dion-train across two "hosts" (network namespaces, netns.py).

ctest -L multihost (one ctest test, multihost_tests; RESOURCE_LOCK multiprocess). Each test makes
its own two hosts, 10.23.0.1 and 10.23.0.2 on a private bridge, and runs one job of 2 hosts x 2
processes: node K's `dion-train --nnodes 2 --node_rank K --nproc 2 --master_addr 10.23.0.1`
inside host K (GLOO_SOCKET_IFNAME=eth0: Gloo's address is the host's own, not the hostname's).

- Equal results: DDP (dp 4), FSDP (fs 4), FSDP x TP (fs 2 x tp 2) give the losses of one process
  within tests/train/parallel/test_parallel.cpp's tolerances (step 0 <= 1e-6, step 1 <= 1e-5, every step
  <= 3e-4 relative; the reasons are there); also under `torchrun --no-python` on both hosts.
- The Python module (build/python/dion_cpp) under torch's launcher: `torchrun --nnodes 2
  --node_rank K --nproc_per_node 2 ... dion_cpp_steps.py` on each host (Muon and Dion2, DDP and
  FSDP steps) gives one host's `torchrun --standalone --nproc_per_node 4` result bit for bit (and
  one process's: DDP bit-identical, FSDP within 1e-5, as tests/python/test_distributed.py).
- Latency and loss: 20 ms each way + 1% loss on host 1's link (tc netem, else the TUN forwarder
  tun_netem.py; the test prints which): the run finishes with equal losses; the step-time cost is
  printed (skips only where neither exists).
- A cut link: host 1's link goes silent mid-run: every process on both hosts exits within
  comm_timeout_s + MARGIN_S, non-zero, an error names the collective; the last checkpoint has its
  manifest.
- Restart: --max_restarts 1 and the link cut after a checkpoint, restored once the launchers
  say they restart: both nodes restart from the last complete checkpoint and the resumed losses
  equal an uninterrupted run's.
- A host killed (SIGKILL of everything on it) while every step checkpoints: host 0's ranks exit
  within comm_timeout_s + MARGIN_S; the job started again resumes from the newest complete
  checkpoint and its losses equal an uninterrupted run's.
- The committing host killed mid-commit: host 0 (rank 0 writes the manifest and renames) killed
  the moment a tmp.step_K folder appears: tmp.step_K stays uncommitted and the job started again
  loads step_K-1 (the previous checkpoint), its losses an uninterrupted run's.
- The rendezvous host unreachable at start: a clear error within rendezvous_timeout_s + MARGIN_S.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("DION_BUILD_DIR", os.path.join(ROOT, "build"))
TRAIN = os.path.join(BUILD, "dion-train")
STEP0_TOL, STEP1_TOL, TOL = 1e-6, 1e-5, 3e-4  # tests/train/parallel/test_parallel.cpp's
COMM_TIMEOUT_S = 10
MARGIN_S = 15  # launcher grace (5 s) + teardown, measured < 7 s (docs/train.md "Multi-node")

_why = netns.unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def shards():
    d = tempfile.mkdtemp(prefix="multihost-shards.")
    subprocess.run([os.path.join(BUILD, "dion-data"), "prepare", os.path.join(ROOT, "data/tinyshakespeare/input.txt"),
                    "-o", os.path.join(d, "shards"), "--shard-size", "100000", "--tokenizer",
                    os.path.join(ROOT, "data/gpt2")], check=True, capture_output=True)
    yield os.path.join(d, "shards")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def work():
    d = tempfile.mkdtemp(prefix="multihost.")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def tiny(data, run_dir, steps=5, rendezvous_timeout_s=60):
    """tests/train/parallel/test_parallel.cpp's tiny() (2 layers, 64 wide, T 64, global batch 4 of 1)."""
    return ["--data_dir", data, "--run_dir", run_dir, "--model_dim", "64", "--n_layer", "2", "--n_head", "2",
            "--sequence_length", "64", "--batch_size", "4", "--device_batch_size", "1", "--val_tokens", "256",
            "--val_loss_every", "0", "--num_iterations", str(steps), "--warmup_ratio", "0", "--dtype", "fp32",
            "--optimizer", "muon", "--scalar_opt", "adamw", "--lr", "0.02", "--log_every", "1",
            "--comm_timeout_s", str(COMM_TIMEOUT_S), "--rendezvous_timeout_s", str(rendezvous_timeout_s)]


def metrics(run_dir):
    """{(kind, step): loss}; a step logged twice (a resumed run) keeps its last record."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("kind") == "train":
                out[("train", j["step"])] = j["loss"]
            elif j.get("kind") == "val":
                out[("val", j["step"])] = j["val_loss"]
    return out


def expect_close(ref, got, what):
    assert got, what + ": no records"
    worst = 0.0
    for (kind, step), loss in got.items():
        assert (kind, step) in ref, f"{what}: no reference {kind} record at step {step}"
        e = ref[(kind, step)]
        rel = abs(loss - e) / abs(e)
        tol = STEP0_TOL if kind == "train" and step == 0 else STEP1_TOL if kind == "train" and step == 1 else TOL
        assert rel <= tol, f"{what}: {kind} step {step} loss {loss} vs {e} (relative {rel:.3g} > {tol})"
        worst = max(worst, rel)
    print(f"{what}: {len(got)} records, max relative difference {worst:.2g}")


_ref_cache = {}


def reference(shards, steps=5):
    """The losses of one process (run once per module and step count)."""
    if steps not in _ref_cache:
        d = tempfile.mkdtemp(prefix="multihost-ref.")
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        r = subprocess.run([TRAIN, *tiny(shards, d, steps)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        _ref_cache[steps] = metrics(d)
        shutil.rmtree(d, ignore_errors=True)
    return _ref_cache[steps]


_plain_cache = {}


def plain_ddp(hosts, work, shards, steps, port):
    """The losses of an uninterrupted 2 hosts x 2 DDP run of `steps` (run once per module and step count)."""
    if steps not in _plain_cache:
        plain = Job(hosts, work, tiny(shards, os.path.join(work, "plain"), steps) + ["--dp_size", "4"], port=port)
        assert plain.wait(180) == [0, 0], plain.dump()
        _plain_cache[steps] = metrics(os.path.join(work, "plain"))
    return _plain_cache[steps]


def host_env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    env["OMP_NUM_THREADS"] = "1"
    return env


class Job:
    """One launcher per host; their output in log files (work/node<K>.log)."""

    def __init__(self, hosts, work, args, launcher=None, port=29500, env=None):
        self.logs, self.procs = [], []
        for k in range(2):
            cmd = (launcher(k, hosts.addr(0), port) if launcher else
                   [TRAIN, "--nnodes", "2", "--node_rank", str(k), "--nproc", "2", "--master_addr", hosts.addr(0),
                    "--master_port", str(port)]) + args
            log = open(os.path.join(work, f"node{k}.log"), "w+")
            self.logs.append(log)
            self.procs.append(hosts.popen(k, cmd, stdout=log, stderr=subprocess.STDOUT, env=env or host_env()))

    def output(self, k):
        self.logs[k].flush()
        with open(self.logs[k].name) as f:
            return f.read()

    def wait(self, timeout):
        codes, end = [], time.monotonic() + timeout
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def wait_for(self, k, pattern, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.output(k))
            if m:
                return m
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.05)
        raise AssertionError(f"no /{pattern}/ in node {k}'s output within {timeout} s:\n" + self.output(k)[-4000:])

    def dump(self):
        return "\n".join(f"--- node {k}\n" + self.output(k)[-6000:] for k in range(2))


def step_ms(out):
    """The median ms/step of rank 0's step lines, past the first (step 0: the warm-up)."""
    ms = [float(m.group(2)) for m in re.finditer(r"\[rank 0\] step (\d+)/\d+ .*?(\d+) ms/step", out)
          if int(m.group(1)) > 0]
    return sorted(ms)[len(ms) // 2] if ms else float("nan")


# ---------------------------------------------------------------------------- equal losses

@pytest.mark.parametrize("name,layout", [("DDP", ["--dp_size", "4"]), ("FSDP", ["--fs_size", "4"]),
                                         ("FSDPxTP", ["--fs_size", "2", "--tp_size", "2"])])
def test_two_hosts_equal_one_process(shards, work, name, layout):
    ref = reference(shards)
    with netns.Hosts(2) as hosts:
        job = Job(hosts, work, tiny(shards, os.path.join(work, "run")) + layout)
        codes = job.wait(180)
        assert codes == [0, 0], job.dump()
    assert "[rank 3]" in job.output(1) and "[rank 0]" in job.output(0), job.dump()
    expect_close(ref, metrics(os.path.join(work, "run")), f"2 hosts x 2 {name}")


def test_torchrun_two_hosts(shards, work):
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun is not on PATH (it comes with torch, requirements.txt)"
    ref = reference(shards)

    def launcher(k, addr, port):
        return [torchrun, "--no-python", "--nnodes", "2", "--node_rank", str(k), "--nproc_per_node", "2",
                "--master_addr", addr, "--master_port", str(port), TRAIN]

    with netns.Hosts(2) as hosts:
        job = Job(hosts, work, tiny(shards, os.path.join(work, "run")) + ["--fs_size", "4"], launcher=launcher)
        codes = job.wait(240)
        assert codes == [0, 0], job.dump()
    expect_close(ref, metrics(os.path.join(work, "run")), "torchrun 2 hosts x 2 FSDP")


def test_python_module_torchrun_two_hosts(work):
    """dion_cpp (build/python) under `torchrun --nnodes 2 ... script.py` on both hosts vs one host x 4."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun is not on PATH (it comes with torch, requirements.txt)"
    pydir = os.path.join(BUILD, "python")
    assert os.path.isdir(os.path.join(pydir, "dion_cpp")), \
        f"no dion_cpp module in {pydir} (build the target dion_python)"
    script = os.path.join(HERE, "dion_cpp_steps.py")
    env = dict(host_env(), PYTHONPATH=pydir, TORCH_COMPILE_DISABLE="1")
    two, one = os.path.join(work, "two_hosts.pt"), os.path.join(work, "one_host.pt")

    def launcher(k, addr, port):
        return [torchrun, "--nnodes", "2", "--node_rank", str(k), "--nproc_per_node", "2", "--master_addr", addr,
                "--master_port", str(port), script]

    with netns.Hosts(2) as hosts:
        job = Job(hosts, work, [two], launcher=launcher, env=env)
        codes = job.wait(180)
        assert codes == [0, 0], job.dump()
        r = hosts.run(0, [torchrun, "--standalone", "--nproc_per_node", "4", script, one], capture_output=True,
                      text=True, env=env, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
    got, want = torch.load(two), torch.load(one)
    assert got["world"] == want["world"] == 4, (got["world"], want["world"])
    print(job.output(0).strip())
    for case in sorted(k for k in want if k != "world"):
        same = all(torch.equal(a, b) for a, b in zip(got[case], want[case]))
        assert same and len(got[case]) == len(want[case]), f"{case}: 2 hosts x 2 differ from one host x 4"
    for kind in ("muon", "dion2"):  # and one process's (test_distributed.py's bounds)
        assert all(torch.equal(a, b) for a, b in zip(got[f"ddp:{kind}"], got[f"single:{kind}"])), kind
        scale = max(w.abs().max().item() for w in got[f"single:{kind}"])
        rel = max((a - b).abs().max().item() for a, b in zip(got[f"fsdp:{kind}"], got[f"single:{kind}"])) / scale
        assert rel <= 1e-5, f"fsdp {kind}: {rel:.3g} from one process"
    print("dion_cpp under torchrun, 2 hosts x 2: DDP and FSDP (Muon, Dion2) bit-identical to one host x 4")


# ---------------------------------------------------------------------------- faults

def test_latency_and_loss(shards, work):
    why = netns.netem_unavailable()
    if why:
        pytest.skip("netem unavailable: " + why)
    steps = 5  # the delay costs seconds a step here (docs/train.md "Multi-node"); step_ms: the median past step 1
    ref = reference(shards, steps)
    with netns.Hosts(2) as hosts:
        base = Job(hosts, work, tiny(shards, os.path.join(work, "base"), steps) + ["--fs_size", "4"])
        assert base.wait(180) == [0, 0], base.dump()
        clean = step_ms(base.output(0))
        via = hosts.netem(1, "delay 20ms loss 1%")
        job = Job(hosts, work, tiny(shards, os.path.join(work, "run"), steps) + ["--fs_size", "4"], port=29510)
        assert job.wait(300) == [0, 0], job.dump()
        slow = step_ms(job.output(0))
        stats = hosts.forwarder_stats()
    expect_close(ref, metrics(os.path.join(work, "run")), f"FSDP 2 hosts, 20 ms + 1% loss on host 1 ({via})")
    print(f"step time: {clean:.0f} ms clean, {slow:.0f} ms with 20 ms each way + 1% loss on host 1 by {via} "
          f"(+{slow - clean:.0f} ms per step)" + (f"; forwarder packets {stats}" if stats else ""))
    if stats:  # the job's traffic crossed the forwarder, and lost packets there
        assert stats["dropped"] > 0 and stats["forwarded"] > 100 * stats["dropped"] / 2, stats


def test_cut_link_every_process_exits(shards, work):
    with netns.Hosts(2) as hosts:
        ckpt = os.path.join(work, "ckpt")
        job = Job(hosts, work, tiny(shards, os.path.join(work, "run"), 200) +
                  ["--dp_size", "4", "--checkpoint_dir", ckpt, "--checkpoint_freq", "3"])
        job.wait_for(0, r"checkpoint \S+step_00000003 written", 120)
        hosts.cut(1)
        t0 = time.monotonic()
        codes = job.wait(COMM_TIMEOUT_S + MARGIN_S)
        took = time.monotonic() - t0
        assert None not in codes, f"still running {COMM_TIMEOUT_S + MARGIN_S} s after the cut:\n" + job.dump()
        assert all(c != 0 for c in codes), job.dump()
        left = [pid for ns in hosts.names for pid in
                subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]
        assert not left, f"processes left in the hosts: {left}"
    print(f"cut link: every process of both hosts exited {took:.1f} s after the cut "
          f"(comm_timeout_s {COMM_TIMEOUT_S}, margin {MARGIN_S})")
    out = job.output(0) + job.output(1)
    assert re.search(r"all_reduce|allreduce|broadcast|all_gather|reduce_scatter|barrier", out), job.dump()
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))
    assert steps, "no checkpoint"
    assert os.path.isfile(os.path.join(ckpt, steps[-1], "manifest.json")), os.listdir(os.path.join(ckpt, steps[-1]))


def test_restart_after_cut_resumes_equal(shards, work):
    steps = 12
    with netns.Hosts(2) as hosts:
        plain = Job(hosts, work, tiny(shards, os.path.join(work, "plain"), steps) + ["--dp_size", "4"], port=29600)
        assert plain.wait(180) == [0, 0], plain.dump()
        ref = metrics(os.path.join(work, "plain"))
        ckpt = os.path.join(work, "ckpt")
        run = os.path.join(work, "run")
        job = Job(hosts, work, tiny(shards, run, steps) + ["--dp_size", "4", "--checkpoint_dir", ckpt,
                                                           "--checkpoint_freq", "4", "--max_restarts", "1"],
                  port=29700)
        job.wait_for(0, r"checkpoint \S+step_00000004 written", 120)
        hosts.cut(1)
        t_cut = time.monotonic()
        for k in range(2):
            job.wait_for(k, r"restart 1 of 1", COMM_TIMEOUT_S + MARGIN_S + 5)
        t_detect = time.monotonic() - t_cut
        hosts.restore(1)
        t_restore = time.monotonic()
        job.wait_for(0, r"resumed from", 90)
        t_resumed = time.monotonic() - t_restore
        codes = job.wait(180)
        assert codes == [0, 0], job.dump()
    got = metrics(run)
    assert max(s for _, s in got) >= steps - 1, got
    expect_close(ref, got, "restarted after a cut link vs uninterrupted")
    print(f"restart: both launchers restarting {t_detect:.1f} s after the cut; rank 0 resumed "
          f"{t_resumed:.1f} s after the link came back")


def test_host_killed_during_checkpoints_resumes(shards, work):
    steps = 10
    with netns.Hosts(2) as hosts:
        ref = plain_ddp(hosts, work, shards, steps, port=29800)
        args = tiny(shards, os.path.join(work, "run"), steps) + ["--dp_size", "4", "--checkpoint_dir",
                                                               os.path.join(work, "ckpt"), "--checkpoint_freq", "1"]
        job = Job(hosts, work, args, port=29810)
        job.wait_for(0, r"checkpoint \S+step_00000003 written", 120)
        hosts.kill_host(1)  # every process of host 1, the launcher included, while the saves go on
        t0 = time.monotonic()
        code0 = job.wait(COMM_TIMEOUT_S + MARGIN_S)[0]
        took = time.monotonic() - t0
        assert code0 not in (None, 0), job.dump()
        died = job.output(0)
        again = Job(hosts, work, args, port=29820)
        assert again.wait(180) == [0, 0], again.dump()
    assert "resumed from" in again.output(0), again.dump()
    print(f"host 1 killed during the saves: host 0's ranks exited after {took:.1f} s; "
          + (re.search(r"dion-train: error: [^\n]*", died) or re.search(r".*", "")).group(0)[:300])
    expect_close(ref, metrics(os.path.join(work, "run")), "resumed after a host died during the saves vs uninterrupted")


def test_committer_host_killed_mid_commit_previous_loads(shards, work):
    """Host 0 (rank 0: the rank that commits) killed while a checkpoint is being written: the
    test watches checkpoint_dir and kills every process of host 0 the moment tmp.step_K appears
    (the ranks write there, rank 0 writes the manifest and renames it to step_K). Host 1's ranks
    exit; tmp.step_K is left uncommitted; the job started again loads step_K-1 and its losses
    equal an uninterrupted run's."""
    steps = 10
    with netns.Hosts(2) as hosts:
        ref = plain_ddp(hosts, work, shards, steps, port=29830)
        ckpt = os.path.join(work, "ckpt")
        args = tiny(shards, os.path.join(work, "run"), steps) + ["--dp_size", "4", "--checkpoint_dir", ckpt,
                                                               "--checkpoint_freq", "1"]
        job = Job(hosts, work, args, port=29840)
        job.wait_for(0, r"checkpoint \S+step_00000002 written", 120)
        pids = hosts.pids(0)  # the launcher and its 2 ranks (no new process until a restart)
        end, saving = time.monotonic() + 60, None
        while saving is None and time.monotonic() < end and job.procs[0].poll() is None:
            saving = next((e.name for e in os.scandir(ckpt) if e.name.startswith("tmp.")), None)
        assert saving, "no checkpoint being written seen within 60 s:\n" + job.dump()
        hosts.kill_host(0, pids)
        t0 = time.monotonic()
        code1 = job.wait(COMM_TIMEOUT_S + MARGIN_S)[1]
        took = time.monotonic() - t0
        assert code1 not in (None, 0), job.dump()
        left = sorted(os.listdir(ckpt))
        k = int(saving[len("tmp.step_"):])
        assert saving in left, f"{saving} was committed or removed before the kill landed: {left}"
        assert f"step_{k:08d}" not in left, left
        again = Job(hosts, work, args, port=29850)
        assert again.wait(180) == [0, 0], again.dump()
    m = re.search(r"resumed from (\S+)", again.output(0))
    assert m and os.path.basename(m.group(1)) == f"step_{k - 1:08d}", (left, again.dump())
    print(f"host 0 killed while {saving} was being written (left: {left}): host 1's ranks exited after "
          f"{took:.1f} s; the job started again resumed from step_{k - 1:08d}")
    expect_close(ref, metrics(os.path.join(work, "run")),
                 "resumed after the committing host died mid-commit vs uninterrupted")


def test_rendezvous_host_unreachable(shards, work):
    with netns.Hosts(2) as hosts:
        hosts.cut(0)
        args = tiny(shards, os.path.join(work, "run"), rendezvous_timeout_s=5)
        cmd = [TRAIN, "--nnodes", "2", "--node_rank", "1", "--nproc", "2", "--master_addr", hosts.addr(0),
               "--master_port", "29500"] + args
        t0 = time.monotonic()
        r = hosts.run(1, cmd, capture_output=True, text=True, env=host_env(), timeout=5 + MARGIN_S + 30)
        took = time.monotonic() - t0
    assert r.returncode != 0, r.stdout + r.stderr
    assert re.search(r"rank [23] of 4: rendezvous at MASTER_ADDR:MASTER_PORT = 10\.23\.0\.1:29500", r.stderr), \
        r.stdout + r.stderr
    assert took < 5 + MARGIN_S, f"took {took:.1f} s"
    print(f"rendezvous host unreachable: failed after {took:.1f} s (rendezvous_timeout_s 5)")


def test_bad_flag_combinations():
    for args, want in [(["--nnodes", "2", "--node_rank", "2", "--nproc", "1"], "--node_rank 2 is not below"),
                       (["--nnodes", "2", "--nproc", "1"], "needs --master_addr"),
                       (["--nnodes", "0", "--nproc", "1"], "--nnodes: '0'"),
                       (["--nnodes", "2", "--master_addr", "h"], "need --nproc"),
                       (["--nproc", "1", "--master_port", "65535", "--max_restarts", "1"], "past 65535"),
                       (["--standalone", "--nnodes", "2", "--master_addr", "h", "--nproc", "1"], "--standalone is one node")]:
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
        r = subprocess.run([TRAIN, *args], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and want in r.stderr, (args, r.returncode, r.stderr)
