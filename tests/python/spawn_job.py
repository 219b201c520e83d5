"""Multi-process jobs of the pytest suite: `world` spawned ranks, each reporting through a queue.

    out = run_job(worker, world, arg, timeout_s, what)   # {rank: what the worker put}

Each rank runs worker(rank, arg, port, queue) (a module-level function: the spawn start method
pickles it) and must put (rank, results) on the queue once. A rank that does not report within
timeout_s fails the test naming the ranks that did and every exit code; processes still alive
after the reports are killed, so a hung rank never hangs the suite.
"""
import os
import queue as queue_mod
import socket

import pytest
import torch


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(worker, world, arg, timeout_s, what, join_timeout_s=10):
    # ctest's python_tests_one_process runs beside other tests; a file that spawns ranks belongs in
    # python_tests, which runs one multi-process test at a time (cmake/DionPython.cmake).
    if os.environ.get("DION_PYTEST_ONE_PROCESS") == "1":
        pytest.fail(f"{what}: this file spawns {world} ranks: list it in DION_PYTHON_MULTIPROCESS_FILES "
                    "(cmake/DionPython.cmake), whose ctest python_tests runs multi-process jobs one at a time")
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, arg, port, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world):
            rank, results = q.get(timeout=timeout_s)
            out[rank] = results
    except queue_mod.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=join_timeout_s)
            if p.is_alive():
                p.kill()
                p.join()
    if len(out) < world:
        pytest.fail(f"{what} did not report within {timeout_s} s "
                    f"(ranks that did: {sorted(out)}; exit codes {[p.exitcode for p in procs]})")
    return out


def run_cases(rank, world, port, report, cases, group_timeout_s):
    """A rank's body for run_job: join a Gloo group of `world` ranks on 127.0.0.1:`port`, run each
    of `cases` ({name: function returning (ok, detail)}) in order, and put (rank, {name: (ok,
    detail)}) on `report`. A case that raises is reported with its traceback; the other cases
    still run (every rank runs the same cases, so their collectives stay in step)."""
    import datetime
    import os
    import traceback

    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.manual_seed(0)
    results = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=group_timeout_s))
        for name, run in cases.items():
            try:
                results[name] = run()
            except Exception:  # noqa: BLE001  (reported per case)
                results[name] = (False, traceback.format_exc())
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        results["setup"] = (False, traceback.format_exc())
    report.put((rank, results))


def check_case(report, world, case):
    """Fails the test unless every one of `world` ranks reported `case` ok in `report` (run_job's
    result of run_cases); a rank whose setup failed fails it with that traceback."""
    for rank in range(world):
        if "setup" in report[rank]:
            pytest.fail(f"rank {rank}: {report[rank]['setup'][1]}")
        ok, detail = report[rank][case]
        assert ok, f"rank {rank}, {case}: {detail}"
