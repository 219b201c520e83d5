"""tools/dion-train/plot.py: loss curves of several runs in one PNG, and its errors.

Two synthetic runs -> a valid PNG of the expected size in which both runs' colours appear;
--log / --title / --smooth; a resumed run's repeated steps (last line wins) and null losses;
every kind of bad input -> exit status 1, a message naming the file and line, no PNG written.
"""
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import PLOT_PY

# matplotlib's default colour cycle: run 1 is tab:blue, run 2 tab:orange.
BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def load_plot_module():
    spec = importlib.util.spec_from_file_location("dion_plot", PLOT_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def train_line(step, loss, **kw):
    d = {"kind": "train", "step": step, "loss": loss, "lr": 0.01, "tokens": 1024 * (step + 1),
         "tokens_per_s": 5000.0, "ms_per_step": 204.8, "time_s": 0.2 * (step + 1)}
    d.update(kw)
    return json.dumps(d)


def val_line(step, loss):
    return json.dumps({"kind": "val", "step": step, "val_loss": loss, "tokens": 1024 * (step + 1),
                       "time_s": 0.2 * (step + 1)})


def make_run(folder, scale=1.0, steps=60, name=None, extra_lines=()):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(int(scale * 100))
    lines = []
    for s in range(steps):
        lines.append(train_line(s, scale * (10.0 / (1 + 0.1 * s)) + 0.3 * rng.random()))
        if s % 20 == 0 or s == steps - 1:
            lines.append(val_line(s, scale * (10.0 / (1 + 0.1 * s))))
    lines.extend(extra_lines)
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if name is not None:
        (folder / "config.yaml").write_text(f"name: {name}\noptimizer: dion2\nlr: 0.01\n")
    return folder


def run_plot(*args):
    return subprocess.run([sys.executable, PLOT_PY, *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def has_colour(pixels, rgb, tol=8):
    return bool((np.abs(pixels[..., :3].astype(int) - np.array(rgb)).max(axis=-1) <= tol).any())


# ---------------------------------------------------------------------------- good input

def test_two_runs_one_png(tmp_path):
    a = make_run(tmp_path / "adamw_run", scale=1.0)
    b = make_run(tmp_path / "dion2_run", scale=0.8, name="Dion2 lr=0.01")
    out = tmp_path / "curves.png"
    r = run_plot(a, b, "-o", out, "--title", "AdamW vs Dion2")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "(2 runs)" in r.stdout
    assert png_size(out) == (1080, 660)  # figsize 9 x 5.5 in at 120 dpi
    assert 20_000 < out.stat().st_size < 2_000_000
    import matplotlib.image
    pixels = (matplotlib.image.imread(str(out)) * 255).round().astype(np.uint8)
    assert has_colour(pixels, BLUE) and has_colour(pixels, ORANGE)
    # Nothing else left in the folder (the temporary PNG was renamed).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adamw_run", "curves.png", "dion2_run"]


def test_log_axis_one_run_default_output(tmp_path):
    a = make_run(tmp_path / "run")
    r = subprocess.run([sys.executable, PLOT_PY, str(a), "--log", "--smooth", "0"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(1 run)" in r.stdout
    assert png_size(tmp_path / "curves.png") == (1080, 660)


def test_help():
    r = run_plot("--help")
    assert r.returncode == 0
    for word in ("RUN_DIR", "--output", "--title", "--log", "--smooth"):
        assert word in r.stdout


def test_labels_resume_and_null(tmp_path):
    plot = load_plot_module()
    run = make_run(tmp_path / "folder_name", steps=3, name="from config")
    assert plot.run_label(str(run)) == "from config"
    assert plot.run_label(str(make_run(tmp_path / "plain", steps=3)) + "/") == "plain"
    # A resumed run repeats steps 1 and 2 after its checkpoint: the later lines win.
    p = tmp_path / "resumed.jsonl"
    p.write_text("\n".join([train_line(0, 5.0), train_line(1, 4.0), train_line(2, 3.0),
                            train_line(1, 4.5), train_line(2, None), val_line(2, 3.3)]) + "\n")
    data = plot.read_metrics(str(p))
    assert data["train"][:2] == [(0, 5.0), (1, 4.5)]
    assert data["train"][2][0] == 2 and math.isnan(data["train"][2][1])
    assert data["val"] == [(2, 3.3)]


def test_smoothing():
    plot = load_plot_module()
    assert plot.smooth([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # debiased: no ramp from 0
    assert plot.smooth([1.0, 3.0], 0.0) == [1.0, 3.0]
    assert plot.auto_weight(10) == 0.0 and plot.auto_weight(5000) == pytest.approx(0.99)
    s = plot.smooth([1.0, math.nan, 3.0], 0.5)
    assert s[0] == 1.0 and math.isnan(s[1]) and s[2] == pytest.approx((0.25 * 1 + 0.5 * 3) / 0.75)


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    run = make_run(tmp_path / "killed")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind":"train","step":60,"lo')  # killed mid-write: no newline
    out = tmp_path / "c.png"
    r = run_plot(run, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "incomplete last line" in r.stderr and "metrics.jsonl:" in r.stderr
    assert out.exists()


# ---------------------------------------------------------------------------- bad input

BAD_LINES = [
    ("{not json", "not a JSON object"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"kind": "test", "step": 1}), '"kind" is "test"; valid: "train", "val"'),
    (json.dumps({"kind": "val", "step": 1, "tokens": 1, "time_s": 1.0}), 'missing "val_loss"'),
    (train_line(1, "high"), '"loss" is "high", not a number'),
    (train_line(1.5, 2.0), '"step" is 1.5, not an integer'),
    (train_line(True, 2.0), '"step" is true, not an integer'),
    (train_line(1, 2.0, tokens=None), '"tokens" is null, not an integer'),
]


@pytest.mark.parametrize("line,message", BAD_LINES)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    run = make_run(tmp_path / "run", steps=2)  # lines 1..4 are good (2 train, 2 val)
    good = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(good[:2] + [line] + good[2:]) + "\n")
    out = tmp_path / "c.png"
    r = run_plot(run, "-o", out)
    assert r.returncode == 1
    assert f"plot.py: error: {run / 'metrics.jsonl'}:3: " in r.stderr, r.stderr
    assert message in r.stderr, r.stderr
    assert not out.exists()


def test_missing_folder_file_and_data(tmp_path):
    good = make_run(tmp_path / "good")
    out = tmp_path / "c.png"

    r = run_plot(good, tmp_path / "nope", "-o", out)
    assert r.returncode == 1 and f"{tmp_path / 'nope'}: no such folder" in r.stderr

    (tmp_path / "empty_dir").mkdir()
    r = run_plot(tmp_path / "empty_dir", "-o", out)
    assert r.returncode == 1
    assert f"{tmp_path / 'empty_dir' / 'metrics.jsonl'}: no such file" in r.stderr

    (tmp_path / "no_data").mkdir()
    (tmp_path / "no_data" / "metrics.jsonl").write_text("\n\n")
    r = run_plot(good, tmp_path / "no_data", "-o", out)
    assert r.returncode == 1 and "no train or val lines" in r.stderr

    r = run_plot(good, "-o", tmp_path / "missing_dir" / "c.png")
    assert r.returncode == 1 and "does not exist" in r.stderr

    for bad in ("1", "-0.1", "nan", "strong"):
        r = run_plot(good, "-o", out, "--smooth", bad)
        assert r.returncode == 2 and f"--smooth {bad}: must be" in r.stderr

    r = run_plot("-o", out)  # no run folder
    assert r.returncode == 2 and "RUN_DIR" in r.stderr
    assert not out.exists()


def test_missing_packages_and_undecodable_config_are_errors_not_tracebacks(tmp_path):
    # A package that fails to import stands in for one that is not installed.
    fake = tmp_path / "fake"
    for package in ("matplotlib", "yaml"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text(f"raise ImportError('no {package} here')\n")
    env = dict(os.environ, PYTHONPATH=str(fake))
    run = make_run(tmp_path / "run", steps=3)
    out = tmp_path / "c.png"
    r = subprocess.run([sys.executable, PLOT_PY, str(run), "-o", str(out)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 1, r.stderr
    assert "needs the Python package matplotlib" in r.stderr and "Traceback" not in r.stderr, r.stderr
    named = make_run(tmp_path / "named", steps=3, name="x")
    r = subprocess.run([sys.executable, PLOT_PY, str(named), "-o", str(out)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 1, r.stderr
    assert "needs the Python package PyYAML" in r.stderr and "Traceback" not in r.stderr, r.stderr
    (named / "config.yaml").write_bytes(b"name: \xff\xfe\n")
    r = run_plot(named, "-o", out)
    assert r.returncode == 1, r.stderr
    assert f"{named / 'config.yaml'}: not valid YAML" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
