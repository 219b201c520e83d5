#!/usr/bin/env python3
"""MoE training speed next to the dense model of the same active parameters, at 1 and 2 ranks.

    python3 bench/moe_speed.py [--build build] [--out runs/moe_speed] [--steps 20] [--rounds 2]
                               [--warmup 2] [--from_step N] [--dtype fp32|bf16] [--cpu_bind cores|none]
                               [--json FILE] [--smoke]

Sides: configs/shakespeare_bytes_dion2.yaml (the main job: dense, 4 x 128) and
configs/shakespeare_bytes_moe.yaml (8 experts of 170 hidden, top_k 2, one shared: about the dense
MLP's active parameters), each in one process and in two (dense: dp 2; MoE: dp 2 x ep 2, the
experts split over the two ranks and the tokens exchanged by all_to_all), one thread a process,
the global batch the same (16 x 256 bytes). Every round runs every side for --steps steps, the
order reversed every other round, so that the machine's load falls on all sides alike. A side's
figures are medians over its steps after the first --warmup (default 2): ms a step (dion-train's wall clock),
tokens/s, the ratio to the dense side at the same ranks (of the medians, and round by round: the
two sides of a pair run one after the other, so a pair shares the machine's load), and the share
of the step spent routing tokens (metrics.jsonl moe_route_ms: grouping
the tokens by expert, the all_to_all to the experts' ranks and back in forward and backward, the
weighted sum; not the experts' GEMMs). Prints a markdown table and appends one JSON object to
--json. --from_step N: every side starts from its config's checkpoint after N steps in one process
(trained once per --out folder; checkpoints move between layouts), so that the experts' load is
that of a run under way rather than of its first steps, where the routers are still random and
the fullest expert gets 2-3x the mean (the table prints the median load). Not a test: nothing
asserts on time. --dtype bf16: every side computes under autocast to bf16 (dion-train --dtype;
the checkpoints of --from_step are the fp32 ones, trained once for both). --cpu_bind (default
cores): the two-process sides run `dion-train --nproc 2 --cpu_bind cores`, each rank on its own
cores (docs/train.md, "Launching"); none: where the kernel puts them. --smoke: a tiny model, 3
steps, one round (ctest moe_bench_smoke: the plumbing).

--warmup: a dp 2 x ep 2 run from a checkpoint takes ~6 steps to settle (the Xeon, 2026-12-06: 170-230
ms a step, then ~150; its processes fault in ~10,000 new pages over those steps, against ~60 a step
after; the dense and 1-rank sides settle after 2), so a steady-state figure wants --steps 20
--warmup 8 (`bench/results/moe_speed/xeon_amx_2026-12-06i.md` has every side's per-step series).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import convergence  # noqa: E402
import machine  # noqa: E402

SIDES = [  # (name, config, ranks, layout keys)
    ("dense, 1 rank", "configs/shakespeare_bytes_dion2.yaml", 1, {}),
    ("MoE, 1 rank", "configs/shakespeare_bytes_moe.yaml", 1, {}),
    ("dense, dp 2", "configs/shakespeare_bytes_dion2.yaml", 2, {"dp_size": 2}),
    ("MoE, dp 2 x ep 2", "configs/shakespeare_bytes_moe.yaml", 2, {"dp_size": 2, "ep_size": 2}),
]
SMOKE = {"model_dim": 32, "n_layer": 1, "n_head": 1, "sequence_length": 32, "batch_size": 4, "val_tokens": 128,
         "expert_dim": 16}


def run_side(build, data, out, side, steps, rnd, smoke, dtype, cpu_bind, start=None):
    """One side's run: `steps` steps from initialization, or from `start` (from_step, checkpoint
    folder) when given (its copy in the run folder: a run writes its own checkpoint at the end)."""
    name, config, ranks, layout = side
    tag = name.replace(" ", "").replace(",", "_") + ("_bf16" if dtype == "bf16" else "")
    rd = os.path.join(out, f"{tag}_r{rnd}")
    ckpt, first = "", 0
    if start:
        first, src = start
        shutil.rmtree(rd, ignore_errors=True)
        ckpt = os.path.join(rd, "start")
        shutil.copytree(src, ckpt)
    keys = {"config": os.path.join(ROOT, config), "data_dir": data, "run_dir": rd, "num_iterations": first + steps,
            "val_loss_every": 0, "log_every": 1, "checkpoint_freq": 0, "checkpoint_dir": ckpt,
            "time_optimizer": "true", "replica_check_every": 0, "dtype": dtype}
    if smoke:
        keys.update(SMOKE)
        if "moe" not in config:
            keys.pop("expert_dim")
    batch = SMOKE["batch_size"] if smoke else 16
    keys.update(layout, device_batch_size=batch // ranks)
    cmd = [os.path.join(build, "dion-train")]
    if ranks > 1:
        cmd += ["--nproc", str(ranks), "--cpu_bind", cpu_bind]
    for k, v in keys.items():
        cmd += [f"--{k}", str(v)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-12:])
        raise convergence.BenchError(f"{name} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    lines = [json.loads(x) for x in open(os.path.join(rd, "metrics.jsonl"))]
    return [x for x in lines if x["kind"] == "train" and x["step"] >= first]


def train_start(build, data, out, config, steps):
    """A checkpoint of `config` after `steps` steps in one process (made once per --out folder)."""
    name = os.path.splitext(os.path.basename(config))[0]
    ckpt = os.path.join(out, f"start_{name}_{steps}")
    if os.path.isdir(ckpt) and any(d.startswith("step_") for d in os.listdir(ckpt)):
        return ckpt
    shutil.rmtree(ckpt, ignore_errors=True)
    cmd = [os.path.join(build, "dion-train"), "--config", os.path.join(ROOT, config), "--data_dir", data,
           "--run_dir", ckpt + "_run", "--num_iterations", str(steps), "--val_loss_every", "0", "--log_every",
           "100", "--checkpoint_freq", str(steps), "--checkpoint_dir", ckpt, "--replica_check_every", "0"]
    print(f"[moe_speed] training {name} for {steps} steps (the start of every side's run)", file=sys.stderr)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-12:])
        raise convergence.BenchError(f"training the start failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return ckpt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("DION_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "moe_speed"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2, help="each run's first steps left out of its figures")
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, 3 steps, one round (the plumbing)")
    ap.add_argument("--from_step", type=int, default=0,
                    help="measure from a checkpoint after this many steps in one process (0: from initialization); "
                         "the experts' load is uneven in the first steps and evens out as the routers learn")
    ap.add_argument("--cpu_bind", default="cores", choices=["cores", "none"],
                    help="the two-process sides' launcher binding (dion-train --nproc 2 --cpu_bind)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="what every side computes in (bf16: autocast, dion-train --dtype bf16)")
    args = ap.parse_args()
    steps, rounds = (3, 1) if args.smoke else (args.steps, args.rounds)
    warmup = 2 if args.smoke else args.warmup
    if steps < warmup + 1 or warmup < 0 or rounds < 1 or args.from_step < 0:
        raise convergence.BenchError(f"--steps {steps} --warmup {warmup} --rounds {rounds} --from_step {args.from_step}: "
                                     "need steps > warmup >= 0, rounds >= 1 and from_step >= 0")
    if args.smoke and args.from_step:
        raise convergence.BenchError("--smoke measures from initialization: leave --from_step out")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    load_before = machine.loadavg()
    data = convergence.prepare_data(args.build, out)
    starts = {}
    if args.from_step:
        for config in sorted({s[1] for s in SIDES}):
            starts[config] = (args.from_step, train_start(args.build, data, out, config, args.from_step))
    got = {s[0]: [] for s in SIDES}
    by_round = {s[0]: [] for s in SIDES}  # each round's median ms a step
    series = {s[0]: [] for s in SIDES}  # each round's ms a step, every step
    t0 = time.time()
    for rnd in range(rounds):
        order = SIDES if rnd % 2 == 0 else SIDES[::-1]
        for side in order:
            recs_all = run_side(args.build, data, out, side, steps, rnd, args.smoke, args.dtype, args.cpu_bind,
                                starts.get(side[1]))
            series[side[0]].append([r["ms_per_step"] for r in recs_all])
            recs = recs_all[warmup:]
            got[side[0]] += recs
            by_round[side[0]].append(statistics.median(r["ms_per_step"] for r in recs))
            print(f"[moe_speed] round {rnd + 1}/{rounds}: {side[0]} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    cpu, flags = machine.cpu()
    rows = []
    for name, _, ranks, _ in SIDES:
        recs = got[name]
        ms = statistics.median(r["ms_per_step"] for r in recs)
        route = [r["moe_route_ms"] / r["ms_per_step"] for r in recs if "moe_route_ms" in r]
        rows.append({"side": name, "ranks": ranks, "ms_per_step": ms,
                     "tokens_per_s": statistics.median(r["tokens_per_s"] for r in recs),
                     "route_share": statistics.median(route) if route else None, "steps": len(recs),
                     "ms_per_step_by_round": by_round[name], "ms_per_step_series": series[name]})
    dense = {r["ranks"]: r for r in rows if r["side"].startswith("dense")}
    for r in rows:  # dense ms / this side's ms, round by round (the two run one after the other)
        pairs = [a / b for a, b in zip(dense[r["ranks"]]["ms_per_step_by_round"], r["ms_per_step_by_round"])]
        r["vs_dense_by_round"] = pairs
    load = [max(x) for r in got["MoE, dp 2 x ep 2"] for x in [r.get("moe_load_imbalance", [])] if x]
    table = {"bench": "moe_speed", "dtype": args.dtype, "cpu_bind": args.cpu_bind, "rows": rows, "steps": steps,
             "warmup": warmup, "rounds": rounds, "smoke": args.smoke,
             "from_step": args.from_step, "expert_load_max_over_mean": statistics.median(load) if load else None,
             "machine": {"cpu": cpu, "cpu_flags": flags, "loadavg": f"{load_before} before; {machine.loadavg()} after",
                         "time_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads_per_process": 1}}
    print(f"- machine: {cpu} ({' '.join(flags)}); load average {table['machine']['loadavg']}; "
          f"{table['machine']['time_utc']}")
    shape = f"{SMOKE['batch_size']} x {SMOKE['sequence_length']} (smoke)" if args.smoke else "16 x 256"
    start = f"from the checkpoint of step {args.from_step} (one process)" if args.from_step else "from initialization"
    print(f"- {args.dtype}; one thread a process, the two-process sides with --cpu_bind {args.cpu_bind}; "
          f"batch {shape} bytes; {steps} steps x {rounds} rounds {start}, medians after each run's first {warmup} steps")
    if load:
        print(f"- experts' load at dp 2 x ep 2 (tokens of the fullest expert / the mean, the most loaded layer): "
              f"median {statistics.median(load):.2f}")
    print("")
    print("| side | ms a step | tokens/s | vs dense at the same ranks | same-round pairs: median (range) "
          "| routing share of the step |")
    print("|---|--:|--:|--:|--:|--:|")
    for r in rows:
        d = dense[r["ranks"]]
        share = f"{100 * r['route_share']:.1f}%" if r["route_share"] is not None else "—"
        p = r["vs_dense_by_round"]
        pairs = f"{statistics.median(p):.2f}x ({min(p):.2f}-{max(p):.2f})"
        print(f"| {r['side']} | {r['ms_per_step']:.0f} | {r['tokens_per_s']:.0f} | "
              f"{r['tokens_per_s'] / d['tokens_per_s']:.2f}x | {pairs} | {share} |")
    print("")
    print(f"ms a step by step (the median over rounds; the first {warmup} left out of the table above):")
    for r in rows:
        by_step = [statistics.median(run[i] for run in r["ms_per_step_series"] if i < len(run))
                   for i in range(max(len(run) for run in r["ms_per_step_series"]))]
        print(f"- {r['side']}: {' '.join(f'{x:.0f}' for x in by_step)}")
    machine.append_json(args.json, table)


if __name__ == "__main__":
    try:
        main()
    except convergence.BenchError as e:
        print(f"moe_speed.py: error: {e}", file=sys.stderr)
        sys.exit(1)
