"""tests/optim/algorithm_names.py — generic code names no algorithm: outside tests and docs, an
algorithm's name may appear only in its math, its driver, the umbrella header (its C++ class),
the Python package's export list, and each tool's one table of what it needs beyond the
optimizer's contract (dion-train's entries, the Python class table, dion-bench's). Checked for
nordion2 (a name no other one contains, and whose math is one header): `grep -rli nordion2 src
include python tools` lists those 7 files.

    python3 tests/optim/algorithm_names.py [REPO_ROOT]
"""
import pathlib
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
ALLOWED = {
    "nordion2": {"include/dion/math/nordion2.h", "src/optim/drivers/dion2.cpp", "include/dion/dion.h",
                 "python/dion_cpp/__init__.py", "src/train/optimizer_entries.cpp", "python/dion_cpp/_class_table.py",
                 "tools/dion-bench/algorithms.cpp"},
}


def files_naming(name):
    out = set()
    for top in ("src", "include", "python", "tools"):
        for p in (ROOT / top).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                try:
                    text = p.read_text(errors="ignore").lower()
                except OSError:
                    continue
                if name in text:
                    out.add(str(p.relative_to(ROOT)))
    return out


bad = False
for name, allowed in ALLOWED.items():
    found = files_naming(name)
    extra = sorted(found - allowed)
    print(f"{name}: {len(found)} files: {', '.join(sorted(found))}")
    if extra:
        print(f"FAIL: '{name}' is named in {', '.join(extra)}: generic code must ask the registry "
              "(dion/optim/algorithm.h), not name an algorithm")
        bad = True
sys.exit(1 if bad else 0)
