"""Multi-process jobs of the pytest suite: `world` spawned ranks, each reporting through a queue.

    out = run_job(worker, world, arg, timeout_s, what)   # {rank: what the worker put}

Each rank runs worker(rank, arg, port, queue) (a module-level function: the spawn start method
pickles it) and must put (rank, results) on the queue once. A rank that does not report within
timeout_s fails the test naming the ranks that did and every exit code; processes still alive
after the reports are killed, so a hung rank never hangs the suite.
"""
import queue as queue_mod
import socket

import pytest
import torch


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(worker, world, arg, timeout_s, what, join_timeout_s=10):
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
