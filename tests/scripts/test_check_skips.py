"""scripts/check_skips.py against hand-made ctest JUnit reports: allowed and refused skips, from
GoogleTest and from pytest's -rs summary, and a missing report. ctest check_skips runs it."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(REPO, "scripts", "check_skips.py")

PASSED = '<testcase name="{name}" status="run" time="0.1"><system-out>{out}</system-out></testcase>'
SKIPPED = ('<testcase name="{name}" status="notrun" time="0.1"><skipped message="SKIP_REGULAR_EXPRESSION matched"/>'
           '<system-out>{out}</system-out></testcase>')
GTEST_OUT = ("[ RUN      ] Cuda.X\n/src/t.cpp:9: Skipped\n{reason}\n\n[  SKIPPED ] Cuda.X (0 ms)\n")


def report(tmp_path, *cases):
    path = tmp_path / "junit.xml"
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="t" tests="%d">%s</testsuite>\n'
                    % (len(cases), "".join(cases)))
    return str(path)


def run(path):
    return subprocess.run([sys.executable, CHECK, path], capture_output=True, text=True)


def test_gtest_skip_for_an_allowed_reason_passes_and_is_counted(tmp_path):
    r = run(report(tmp_path, SKIPPED.format(name="Cuda.X", out=GTEST_OUT.format(reason="no CUDA device: skipped")),
                   PASSED.format(name="A.B", out="ok")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped of 2 ctest tests" in r.stdout and "1 x no CUDA device: skipped" in r.stdout


def test_gtest_skip_for_another_reason_fails_naming_the_test(tmp_path):
    r = run(report(tmp_path, SKIPPED.format(name="Data.Tok", out=GTEST_OUT.format(reason="GPT-2 files not found"))))
    assert r.returncode == 1
    assert "Data.Tok: GPT-2 files not found" in r.stdout


def test_pytest_skips_inside_a_passing_ctest_test_are_found(tmp_path):
    out = ("..s.s\n=== short test summary info ===\n"
           "SKIPPED [2] tests/python/test_x.py:12: tensorboard not installed\n"
           "SKIPPED [1] tests/python/test_y.py:3: no CUDA device here\n3 passed, 3 skipped in 1.0s\n")
    r = run(report(tmp_path, PASSED.format(name="python_tests", out=out)))
    assert r.returncode == 1
    assert "python_tests: tests/python/test_x.py:12: tensorboard not installed (x2)" in r.stdout
    assert "3 skipped of 1 ctest tests" in r.stdout


def test_no_skip_passes(tmp_path):
    r = run(report(tmp_path, PASSED.format(name="A.B", out="[  PASSED  ] 1 test.")))
    assert r.returncode == 0 and "0 skipped of 1 ctest tests (none)" in r.stdout


@pytest.mark.parametrize("content", [None, '<testsuite name="t" tests="0"></testsuite>'])
def test_a_missing_or_empty_report_fails(tmp_path, content):
    path = tmp_path / "junit.xml"
    if content is not None:
        path.write_text(content)
    r = run(str(path))
    assert r.returncode != 0
