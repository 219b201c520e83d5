#!/usr/bin/env python3
"""Markdown for docs/benchmarks.md from dion-bench's JSON tables (one object per line).

    python3 bench/bench_report.py build/dion_bench.jsonl > section.md

Reads the tables written by `dion-bench --json` (ortho, step, micro, dist), by
bench/reference_step.py (reference_step) and bench/reference_train.py (train); prints one markdown section per table, each with
the machine line recorded with it (load average, threads, CPU flags) and, where the issue sets
a goal, whether it is met. Formatting only: every number comes from the JSON.
"""
import json
import sys

MIB = 2 ** 20


def machine_line(m):
    parts = [f"load average {m.get('loadavg', '?')}", f"{m.get('torch_threads', '?')} thread(s)"]
    if m.get("cpu"):
        parts.append(m["cpu"])
    if m.get("cpu_flags"):
        parts.append("flags " + " ".join(m["cpu_flags"]))
    if m.get("onednn_max_cpu_isa"):
        parts.append(f"ONEDNN_MAX_CPU_ISA={m['onednn_max_cpu_isa']}")
    dt = m.get("cpu_compute_dtype", {})
    if dt:
        parts.append("gram NS in " + dt["gram"]["dtype"] + ", fast path (bf16 wanted) in " + dt["fast_bf16"]["dtype"])
    parts.append(f"torch {m.get('torch_version', '?')}")
    if m.get("time_utc"):
        parts.append(m["time_utc"])
    return "- machine: " + "; ".join(parts)


def goal(value, target, lower_is_better=False):
    ok = value <= target if lower_is_better else value >= target
    return f"{value:.2f} {'met' if ok else 'NOT met'}"


def ortho(t):
    print("### Orthogonalizers vs the same-dtype matmul (`dion-bench ortho`)\n")
    print(machine_line(t["machine"]))
    print(f"- median of {t['reps']} interleaved repetitions, process CPU time; rate = the "
          "reference's flops 5 (4 r^2 c + 2 r^3) / time, as a multiple of the matmul's rate "
          "(`[B, r, c] x [B, c, r]`, contiguous); goal (bf16): 1.3x square, 1.6x 1:4")
    print()
    print("| dtype | m x n x B | matmul ms (GFLOP/s) | exact ms (x rate) | fast ms (x rate) | "
          "gram ms (x rate) | sv exact | sv fast | sv gram | fast - exact max abs |")
    print("|---|---|--:|--:|--:|--:|--|--|--|--:|")
    for r in t["rows"]:
        mm, ex, fa, gr = r["matmul"], r["exact"], r["fast"], r["gram"]
        square = r["m"] == r["n"]
        target = 1.3 if square else 1.6
        fast_x = (goal(fa["x_matmul_rate"], target) if r["dtype"] == "bf16"
                  else f"{fa['x_matmul_rate']:.2f}")
        sv = lambda v: (f"[{v['sv_min']:.3f}, {v['sv_max']:.3f}]" if "sv_min" in v else "—")  # noqa
        diff = f"{fa['max_abs_diff_to_exact']:.1e}" if "max_abs_diff_to_exact" in fa else "—"
        print(f"| {r['dtype']} | {r['m']} x {r['n']} x {r['batch']} | {mm['ms']:.2f} "
              f"({mm['gflops']:.0f}) | {ex['ms']:.1f} ({ex['x_matmul_rate']:.2f}) | "
              f"{fa['ms']:.1f} ({fast_x}) | {gr['ms']:.1f} ({gr['x_matmul_rate']:.2f}, "
              f"{r.get('gram_dtype', 'fp16')}) | "
              f"{sv(ex)} | {sv(fa)} | {sv(gr)} | {diff} |")
    print()


def step(t):
    print("### Optimizer step per path, C++ (`dion-bench step`)\n")
    print(machine_line(t["machine"]))
    print(f"- median of {t['reps']} interleaved steps, process CPU time; bytes: allocated by one "
          "steady step (counting CPU allocator); diff: max |p - p_exact| / max |p_exact| after "
          f"all steps; peak RSS {t['peak_rss_bytes'] / MIB:.0f} MiB")
    print()
    print("| set | algorithm | exact ms | fast ms (/ exact) | gram ms | exact MiB/step | "
          "fast MiB/step | gram MiB/step | first step exact / fast ms | diff fast | diff gram |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in t["rows"]:
        ex = r["exact"]
        fa, gr = r.get("fast"), r.get("gram")
        cell = lambda v, k, f: (f.format(v[k]) if v else "—")  # noqa: E731
        mib = lambda v: f"{v['alloc_bytes'] / MIB:.1f}" if v else "—"  # noqa: E731
        ratio = f" ({fa['ms'] / ex['ms']:.2f})" if fa else ""
        print(f"| {r['set']} | {r['algo']} | {ex['ms']:.1f} | "
              f"{cell(fa, 'ms', '{:.1f}')}{ratio} | {cell(gr, 'ms', '{:.1f}')} | "
              f"{ex['alloc_bytes'] / MIB:.1f} | {mib(fa)} | {mib(gr)} | "
              f"{ex['first_ms']:.0f} / {cell(fa, 'first_ms', '{:.0f}')} | "
              f"{cell(fa, 'max_rel_diff_to_exact', '{:.1e}')} | "
              f"{cell(gr, 'max_rel_diff_to_exact', '{:.1e}')} |")
    print()


def reference(t):
    print("### Optimizer step vs microsoft/dion, one Python process (`bench/reference_step.py`)\n")
    print(machine_line(t["machine"]))
    print(f"- median of {t['reps']} interleaved steps, process CPU time, one thread; bytes: "
          "allocated by one steady step (torch.profiler, both sides); goals: fast / eager <= 0.7, "
          "fast / compiled <= 0.8, bytes fast / reference <= 0.25")
    print()
    has_c = any("ref_compiled" in r for r in t["rows"])
    head = "| set | class | ref eager ms | ours exact ms | ours fast ms | fast / eager |"
    rule = "|---|---|--:|--:|--:|--:|"
    if has_c:
        head += " ref compiled ms (first step, wall) | fast / compiled |"
        rule += "--:|--:|"
    head += (" ref MiB/step | fast MiB/step | bytes fast / ref | first step ms: ref eager / fast |"
             " exact identical | fast diff |")
    rule += "--:|--:|--:|--:|--|--:|"
    print(head)
    print(rule)
    for r in t["rows"]:
        re, ox, of = r["ref_eager"], r["ours_exact"], r["ours_fast"]
        line = (f"| {r['set']} | {r['class']} | {re['ms']:.1f} | {ox['ms']:.1f} | {of['ms']:.1f} | "
                f"{goal(of['ms'] / re['ms'], 0.7, True)} |")
        if has_c:
            rc = r.get("ref_compiled")
            line += (f" {rc['ms']:.1f} ({rc.get('first_wall_ms', rc['first_ms']) / 1e3:.1f} s) | "
                     f"{goal(of['ms'] / rc['ms'], 0.8, True)} |" if rc else " — | — |")
        ratio = of["alloc_bytes"] / re["alloc_bytes"] if re["alloc_bytes"] else float("nan")
        line += (f" {re['alloc_bytes'] / MIB:.1f} | {of['alloc_bytes'] / MIB:.1f} | "
                 f"{goal(ratio, 0.25, True)} | {re['first_ms']:.0f} / {of['first_ms']:.0f} | "
                 f"{'yes' if ox['max_rel_diff_to_ref_eager'] == 0 else 'no'} | "
                 f"{of['max_rel_diff_to_ref_eager']:.1e} |")
        print(line)
    print()


def micro(t):
    print("### Dion's microbenchmark: one [s, s] parameter (`dion-bench micro`)\n")
    print(machine_line(t["machine"]))
    print(f"- median of {t['reps']} interleaved steps, process CPU time, exact path")
    print()
    print("| s | Muon ms | Dion rank s/4 ms | Dion rank s/16 ms | Dion r/4 / Muon | Dion r/16 / Muon |")
    print("|--:|--:|--:|--:|--:|--:|")
    for r in t["rows"]:
        print(f"| {r['size']} | {r['muon']:.2f} | {r['dion_r4']:.2f} | {r['dion_r16']:.2f} | "
              f"{r['dion_r4'] / r['muon']:.2f} | {r['dion_r16'] / r['muon']:.2f} |")
    print()


def dist(t):
    print("### Distributed optimizer step, 1 / 2 / 4 ranks (`dion-bench dist`)\n")
    print(machine_line(t["machine"]))
    worlds = sorted({r["world"] for r in t["rows"]})
    print(f"- the block matrices of the {t['set']} set (per block q, k, v, o [d, d], up [4d, d], down "
          "[d, 4d]; fp32, bf16 orthogonalization, exact path); ranks are processes (Gloo over loopback, "
          f"{t['threads_per_rank']} thread each) on this machine's {t['hardware_threads']} shared cores: "
          "2 and 4 ranks measure the algorithm's communication and its overlap with compute, not a "
          "cluster (4 ranks time-slice 2 cores)")
    print(f"- time: median of {t['reps']} steps interleaved with the other variants and the cost model's "
          "probes, a barrier before each; wall = the slowest rank's wall time, CPU = rank 0's process "
          "CPU time (its Gloo threads included); 1 process = the same optimizer without a Distribution")
    print("- bytes: what one steady step passed to the collectives per rank (comm::CommStats, every rank "
          "equal), including the optimizer's 8-byte agreement all_reduce; fsdp: every matrix's rows "
          "sharded; ddp: replicated (legacy Dion syncs P and R itself, Muon / Dion2 split the megabatches "
          "and all_gather)")
    print()
    single = {r["variant"]: r for r in t["rows"] if r["layout"] == "single"}
    multi = [w for w in worlds if w > 1]
    head = "| layout | variant | 1 process ms wall (CPU) |"
    rule = "|---|---|--:|"
    for w in multi:
        head += f" {w} ranks ms wall (CPU) | / 1 process |"
        rule += "--:|--:|"
    for w in multi:
        head += f" KiB/step/rank at {w} |"
        rule += "--:|"
    print(head)
    print(rule)
    keys = []
    for r in t["rows"]:
        if r["layout"] != "single" and (r["layout"], r["variant"]) not in keys:
            keys.append((r["layout"], r["variant"]))
    by = {(r["layout"], r["variant"], r["world"]): r for r in t["rows"]}
    for layout, variant in keys:
        one = single.get(variant)
        line = f"| {layout} | {variant} | " + (f"{one['wall_ms']:.1f} ({one['cpu_ms']:.1f}) |" if one else "— |")
        for w in multi:
            r = by.get((layout, variant, w))
            ratio = f"{r['wall_ms'] / one['wall_ms']:.2f}" if r and one else "—"
            line += f" {r['wall_ms']:.1f} ({r['cpu_ms']:.1f}) | {ratio} |" if r else " — | — |"
        for w in multi:
            r = by.get((layout, variant, w))
            line += f" {r['bytes_per_rank'][0] / 1024:.1f} |" if r else " — |"
        print(line)
    print()


def train(t):
    c = t["config"]
    print("### Trainer tokens/s vs the reference's GPT model, eager and compiled (`bench/reference_train.py`)\n")
    print(machine_line(t["machine"]))
    print(f"- GPT {c['n_layer']} layers x {c['model_dim']} wide x {c['n_head']} heads, sequence "
          f"{c['sequence_length']}, batch {c['batch']} (one micro-batch), vocabulary {c['vocab']}, "
          f"{c['dtype']}, one thread, embedding and lm_head on {c['scalar_opt']}; median of {c['steps']} "
          f"steps after {c['warmup']}; reference: microsoft/dion's models/gpt_model.py and optimizer class, "
          "eager and (where measured) torch.compile'd by its GPT.compile, the first step (compile) apart, "
          "forward + backward + step; ours: dion-train (wall: metrics.jsonl's "
          "ms_per_step; CPU: the difference of two runs' process CPU time per step)")
    if t.get("reference_error"):
        print(f"- reference not measured: {t['reference_error']}")
    print()
    print("| optimizer | reference tok/s wall (CPU) | compiled reference tok/s wall (CPU), first step s | "
          "dion-train tok/s wall (CPU) | ours / reference, wall | ours / reference, CPU | "
          "ours / compiled, wall | ours / compiled, CPU |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in t["rows"]:
        ref, comp, our = r.get("reference"), r.get("reference_compiled"), r["ours"]
        cell = lambda v: f"{v['tokens_per_s_wall']:.0f} ({v['tokens_per_s_cpu']:.0f})" if v else "—"  # noqa: E731
        ratio = lambda k: f"{r[k]:.2f}" if k in r else "—"  # noqa: E731
        ccell = f"{cell(comp)}, {comp['first_step_s']:.1f}" if comp else "—"
        print(f"| {r['optimizer']} | {cell(ref)} | {ccell} | {cell(our)} | {ratio('ratio_wall')} | "
              f"{ratio('ratio_cpu')} | {ratio('ratio_wall_compiled')} | {ratio('ratio_cpu_compiled')} |")
    print()


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        tables = [json.loads(line) for line in f if line.strip()]
    writers = {"ortho": ortho, "step": step, "reference_step": reference, "micro": micro, "dist": dist,
               "train": train}
    for t in tables:
        if t["table"] == "train_speed":
            continue  # bench/train_speed.py writes its own markdown (bench/dion_bench.sh prints it)
        writers[t["table"]](t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
