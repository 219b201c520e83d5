#!/usr/bin/env python3
"""Loss curves of one or more dion-train runs in one PNG.

    plot.py RUN_DIR [RUN_DIR ...] [-o curves.png] [--title T] [--log] [--smooth S|auto]

What it does: reads RUN_DIR/metrics.jsonl of every run (the schema is in docs/formats.md) and
draws, one colour per run, the train loss of every step (thin, light), its smoothed curve
(an exponential moving average debiased like TensorBoard's, weight --smooth; "auto", the
default, averages over about 2% of the run's steps: weight 1 - 50/n for n train points) and the
validation loss (markers). A run's label is "name" from RUN_DIR/config.yaml when that file has one, else
the folder's name. If a step appears more than once (a resumed run repeats the steps after its
last checkpoint), the last line wins. A loss of null (what the trainer's JSON writer emits for
NaN or infinity) is a gap in the curve.

What it does not do: read TensorBoard files, or anything but metrics.jsonl. Errors (a missing
folder or file, a malformed line, a run without data) are reported as "plot.py: error: ..."
naming the file and line, with exit status 1; nothing is written then. An incomplete last line
without its newline (a run killed while writing) is skipped with a warning.
"""
import argparse
import json
import math
import os
import sys
import tempfile

# The fields of each kind of line and their types (bool is not a number here).
SCHEMA = {
    "train": {"step": int, "loss": float, "lr": float, "tokens": int, "tokens_per_s": float,
              "ms_per_step": float, "time_s": float},
    "val": {"step": int, "val_loss": float, "tokens": int, "time_s": float},
}
# Fields that may be null (a non-finite value written by a JSON library without NaN).
NULLABLE = {"loss", "val_loss", "tokens_per_s", "ms_per_step"}


class PlotError(Exception):
    """A user-facing error: the message names the file (and line) and what is wrong."""


# ---------------------------------------------------------------------------- reading

def _check_field(where, obj, key, kind_type):
    if key not in obj:
        raise PlotError(f"{where}: missing \"{key}\" (a {obj['kind']} line has "
                        f"{', '.join(SCHEMA[obj['kind']])})")
    v = obj[key]
    if v is None and key in NULLABLE:
        return math.nan
    ok = (isinstance(v, int) and not isinstance(v, bool)) if kind_type is int else \
         (isinstance(v, (int, float)) and not isinstance(v, bool))
    if not ok:
        want = "an integer" if kind_type is int else "a number"
        raise PlotError(f"{where}: \"{key}\" is {json.dumps(v)}, not {want}")
    return kind_type(v)


def read_metrics(path):
    """{'train': [(step, loss)], 'val': [(step, val_loss)]}, sorted by step, last line per step."""
    if not os.path.isfile(path):
        raise PlotError(f"{path}: no such file (is this a dion-train run folder?)")
    with open(path, "rb") as f:
        raw = f.read()
    lines = raw.split(b"\n")
    torn_tail = not raw.endswith(b"\n") and raw != b""
    series = {"train": {}, "val": {}}
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if torn_tail and number == len(lines):
                print(f"plot.py: warning: {where}: incomplete last line (run interrupted?), "
                      "skipped", file=sys.stderr)
                continue
            raise PlotError(f"{where}: not a JSON object ({e})") from None
        if not isinstance(obj, dict):
            raise PlotError(f"{where}: not a JSON object")
        kind = obj.get("kind")
        if kind not in SCHEMA:
            raise PlotError(f"{where}: \"kind\" is {json.dumps(kind)}; valid: \"train\", \"val\"")
        values = {k: _check_field(where, obj, k, t) for k, t in SCHEMA[kind].items()}
        y = values["loss" if kind == "train" else "val_loss"]
        series[kind][values["step"]] = y
    return {k: sorted(v.items()) for k, v in series.items()}


def run_label(run_dir):
    """"name" from RUN_DIR/config.yaml if present, else the folder's name."""
    config = os.path.join(run_dir, "config.yaml")
    if os.path.isfile(config):
        try:
            import yaml  # only needed here
        except ImportError:
            raise PlotError(f"{config}: reading it needs the Python package PyYAML: pip install "
                            "pyyaml") from None
        try:
            with open(config, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise PlotError(f"{config}: not valid YAML ({e})") from None
        if isinstance(doc, dict) and doc.get("name") not in (None, ""):
            return str(doc["name"])
    return os.path.basename(os.path.normpath(os.path.abspath(run_dir)))


def load_run(run_dir):
    if not os.path.isdir(run_dir):
        raise PlotError(f"{run_dir}: no such folder")
    path = os.path.join(run_dir, "metrics.jsonl")
    data = read_metrics(path)
    if not data["train"] and not data["val"]:
        raise PlotError(f"{path}: no train or val lines to plot")
    return run_label(run_dir), data


# ---------------------------------------------------------------------------- drawing

def smooth(values, weight):
    """Exponential moving average, debiased (TensorBoard's smoothing); NaNs are skipped."""
    out, last, n = [], 0.0, 0
    for v in values:
        if math.isnan(v):
            out.append(math.nan)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight ** n) if weight > 0 else v)
    return out


def auto_weight(n_points):
    """The EMA weight whose averaging window is about 2% of the run (at least one point)."""
    return 1.0 - 1.0 / max(1.0, n_points / 50.0)


def plot(runs, out, title, log, smoothing):
    try:
        import matplotlib
    except ImportError:
        raise PlotError("drawing needs the Python package matplotlib: pip install matplotlib "
                        "(requirements.txt lists it)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, data) in enumerate(runs):
        c = colours[i % len(colours)]
        if data["train"]:
            steps, losses = zip(*data["train"])
            ax.plot(steps, losses, color=c, alpha=0.25, linewidth=0.8)
            w = auto_weight(len(losses)) if smoothing is None else smoothing
            ax.plot(steps, smooth(losses, w), color=c, linewidth=1.8, label=f"{label} train")
        if data["val"]:
            steps, losses = zip(*data["val"])
            ax.plot(steps, losses, color=c, marker="o", markersize=5, linestyle="--",
                    linewidth=1.0, label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()

    # Written beside the target and renamed: a failed run never leaves half a PNG behind.
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".plot-", suffix=".png", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="plot.py",
        description="Draw the train and validation loss of dion-train runs (RUN_DIR/metrics.jsonl) "
                    "in one PNG, one colour per run.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run folder holding metrics.jsonl")
    p.add_argument("-o", "--output", default="curves.png", help="the PNG to write (default: %(default)s)")
    p.add_argument("--title", default="Loss", help="the plot's title (default: %(default)s)")
    p.add_argument("--log", action="store_true", help="logarithmic loss axis")
    p.add_argument("--smooth", default="auto",
                   help="EMA weight of the smoothed train curve, in [0, 1); 0: none; auto: a window "
                        "of about 2%% of the run's steps (default: %(default)s)")
    args = p.parse_args(argv)
    smoothing = None
    if args.smooth != "auto":
        try:
            smoothing = float(args.smooth)
        except ValueError:
            smoothing = math.nan
        if not 0 <= smoothing < 1:
            p.error(f"--smooth {args.smooth}: must be 'auto' or a number in [0, 1)")
    try:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise PlotError(f"{args.output}: folder {folder} does not exist")
        if os.path.isdir(args.output):
            raise PlotError(f"-o {args.output}: is a folder; give the PNG file to write, e.g. "
                            f"{os.path.join(args.output, 'curves.png')}")
        runs = [load_run(r) for r in args.runs]
        plot(runs, args.output, args.title, args.log, smoothing)
    except PlotError as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({len(runs)} run{'s' if len(runs) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
