"""The reference's ranges table (tests/vectors/reference_ranges.json), checked against microsoft/dion
itself: every value the table says the reference accepts must build and step there, every value it
says the reference refuses must raise there.

Needs the reference importable: ctest runs it as part of `python_live_reference` only when the build
is configured with -DDION_REFERENCE_DIR=/path/to/microsoft/dion; python_tests leaves it out (the
table test against dion_cpp, test_ranges.py, needs nothing outside the repository).
"""
import pytest
import torch

from test_ranges import build, cases, step

try:
    import dion
except ImportError as e:  # a collection error names what is missing and how to get it
    raise ImportError("the reference package microsoft/dion is not importable: configure with "
                      "-DDION_REFERENCE_DIR=/path/to/a/checkout (ctest python_live_reference), or put "
                      "one on PYTHONPATH") from e


@pytest.mark.parametrize("row,cls,outcome,value", cases("ctor"))
def test_reference_agrees_with_the_table(row, cls, outcome, value):
    if outcome == "refused":
        with pytest.raises(Exception):
            opt, params = build(dion, cls, row, value, "ctor")
            step(opt, params)
        return
    opt, params = build(dion, cls, row, value, "ctor")  # extra: the reference builds it
    if outcome == "accepted":
        step(opt, params)
        assert all(torch.isfinite(p).all() for p in params)
