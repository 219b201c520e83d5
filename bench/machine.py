"""The machine line every benchmark table carries (as tools/dion-bench/measure.cpp writes it):
load average, threads, CPU model and the flags that decide the matmul paths, torch version.

    import machine; table["machine"] = machine.info(torch, load_before)

Not a benchmark itself; no timing here."""
import json
import time

WANTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu():
    """(model name with its x86 family and model numbers, the wanted flags). A VM's model name can
    be as bare as "AMD EPYC": the numbers tell the kinds apart (family 25: Zen 3 / Zen 4 (model
    17: Genoa), 26: Zen 5)."""
    model, flags, numbers = "", [], {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                if key in ("cpu family", "model") and key not in numbers:
                    numbers[key] = value.strip()
                if key == "flags" and not flags:
                    flags = [x for x in value.split() if x in WANTED_FLAGS]
    except OSError:
        pass
    if "cpu family" in numbers:
        model += f", family {numbers['cpu family']} model {numbers.get('model', '?')}"
    return model, flags


def info(torch, load_before):
    """The machine dict of a table measured between `load_before` (loadavg()) and now."""
    model, flags = cpu()
    return {"loadavg": f"{load_before} before; {loadavg()} after", "torch_threads": torch.get_num_threads(),
            "cpu": model, "cpu_flags": flags, "torch_version": torch.__version__,
            "time_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def append_json(path, table):
    """Append one table as a JSON line to `path` (the --json file bench/bench_report.py reads); no-op without a path."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(table) + "\n")
