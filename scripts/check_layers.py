#!/usr/bin/env python3
"""scripts/check_layers.py — the layering of docs/architecture.md, checked on every #include.

    python3 scripts/check_layers.py [REPO_ROOT]     # ctest `layers` runs this

Each library directory belongs to a layer (include/dion/<layer>/ and src/<layer>/; python/ and
tools/*/ are layers of their own). A file may include `dion/<x>/...` only for an x its layer
lists below (dion/errors.h, which needs nothing, is open to all), and the data layer includes no
LibTorch at all (torch/, ATen/, c10/). A directory with no rule fails too, so that a new layer is
added here and in docs/architecture.md together. Prints one line per violation (file:line, what
it includes, what its layer may include) and exits 1; exits 0 with a summary otherwise.

Not checked: tests/, bench/, examples/ (they may include anything), include order or style.
"""
import pathlib
import re
import sys

# layer -> the dion/ sub-directories its files may include (its own always; dion/errors.h always).
LAYERS = {
    "cuda": {"cuda"},                                    # fused CUDA kernels
    "math": {"math", "cuda"},                            # the algorithms over lists of tensors
    "comm": {"comm"},                                    # process groups, meshes, async work
    "data": {"data"},                                    # tokenizer, shards (no LibTorch)
    "launch": {"launch"},                                # the local launcher (no LibTorch)
    "optim": {"optim", "math", "cuda", "comm"},          # optimizer classes, drivers, layouts, assembly
    "train": {"train", "optim", "math", "cuda", "comm", "data"},  # the trainer
    "python": {"optim", "math", "cuda", "comm", "data", "train"},  # dion_cpp bindings
    "tools": {"optim", "math", "cuda", "comm", "data", "train", "launch"},  # command-line programs
}
NO_TORCH = {"data", "launch"}
TORCH_PREFIXES = ("torch/", "ATen/", "c10/", "c10d/", "caffe2/")
# Files directly in include/dion/: errors.h is the base of everything; dion.h is the optimizer's
# umbrella header (a training program's single include).
TOP_LEVEL = {"errors.h": set(), "dion.h": LAYERS["optim"]}
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layer_files(root: pathlib.Path):
    """Yields (layer or None, directory label, file) for every checked source file."""
    for base in (root / "include" / "dion", root / "src"):
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir()):
            if entry.is_file():
                if base.name == "dion" and entry.suffix in SOURCE_SUFFIXES:
                    yield ("top:" + entry.name if entry.name in TOP_LEVEL else None,
                           str(entry.relative_to(root)), entry)
                continue
            layer = entry.name if entry.name in LAYERS else None
            for f in sorted(entry.rglob("*")):
                if f.suffix in SOURCE_SUFFIXES:
                    yield layer, str(entry.relative_to(root)), f
    for f in sorted((root / "python").rglob("*")) if (root / "python").is_dir() else []:
        if f.suffix in SOURCE_SUFFIXES:
            yield "python", "python", f
    for tool in sorted((root / "tools").iterdir()) if (root / "tools").is_dir() else []:
        for f in sorted(tool.rglob("*")) if tool.is_dir() else []:
            if f.suffix in SOURCE_SUFFIXES:
                yield "tools", str(tool.relative_to(root)), f


def check(root: pathlib.Path) -> int:
    problems, files, unknown = [], 0, set()
    for layer, label, path in layer_files(root):
        if layer is None:
            unknown.add(label)
            continue
        files += 1
        if layer.startswith("top:"):
            allowed, own, name = TOP_LEVEL[layer[4:]], None, layer[4:]
        else:
            allowed, own, name = LAYERS[layer], layer, layer
        rel = path.relative_to(root)
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if layer in NO_TORCH and inc.startswith(TORCH_PREFIXES):
                problems.append(f"{rel}:{lineno}: includes <{inc}>: layer '{name}' uses no LibTorch")
            if not inc.startswith("dion/") or inc == "dion/errors.h":
                continue
            parts = inc.split("/")
            target = parts[1] if len(parts) > 2 else None  # dion/<target>/x.h; None: dion/x.h
            if target is None:
                ok = inc == "dion/dion.h" and layer in ("python", "tools")
            else:
                ok = target == own or target in allowed
            if not ok:
                may = ", ".join(f"dion/{x}/" for x in sorted(allowed | ({own} if own else set())))
                problems.append(f"{rel}:{lineno}: includes \"{inc}\": layer '{name}' may include "
                                f"only {may or 'nothing from dion/'} and dion/errors.h "
                                f"(docs/architecture.md)")
    for label in sorted(unknown):
        problems.append(f"{label}: no layer rule: add it to LAYERS in scripts/check_layers.py and "
                        f"to the table in docs/architecture.md")
    for p in problems:
        print(p)
    if problems:
        print(f"layers: {len(problems)} violation(s)")
        return 1
    print(f"layers: {files} files checked, every include follows docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(check(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()))
