"""Shared fixtures of the tests/train/io Python tests: where the C++ test tool and plot.py are.

Run through ctest (ctest -R trainio_python_tests), which sets DION_TRAINIO_TOOL to the built
tests/train/io/trainio_tool.cpp; by hand: DION_TRAINIO_TOOL=build/trainio_tool python3 -m pytest -q tests/train/io
(without it, build/trainio_tool is tried, and the tests that need it skip when it is absent).
"""
import os
import subprocess

import pytest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLOT_PY = os.path.join(SOURCE_DIR, "tools", "dion-train", "plot.py")


@pytest.fixture(scope="session")
def trainio_tool():
    """A function running trainio_tool with arguments; returns its stdout."""
    exe = os.path.abspath(os.environ.get("DION_TRAINIO_TOOL") or
                          os.path.join(SOURCE_DIR, "build", "trainio_tool"))
    if not os.path.isfile(exe):
        pytest.fail(f"trainio_tool not built ({exe}): build the target trainio_tool, or set "
                    "DION_TRAINIO_TOOL")

    def run(*args):
        r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"trainio_tool {' '.join(map(str, args))} failed:\n{r.stderr}"
        return r.stdout
    return run
