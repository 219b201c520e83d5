#!/usr/bin/env python3
"""Fails the test command on a skip that tests/allowed_skips.txt does not allow.

    scripts/check_skips.py build/ctest-junit.xml [--allowed tests/allowed_skips.txt]

Reads ctest's JUnit report (`ctest --output-junit`). A skip is
  - a GoogleTest case that ctest reports as skipped (gtest_discover_tests marks "[  SKIPPED ]"),
    its reason the message GoogleTest printed after "Skipped";
  - a pytest skip inside any ctest test, from the `-rs` summary lines pytest prints
    ("SKIPPED [2] tests/python/test_x.py:12: reason").
Prints the number of skips per reason; exit 1 when a reason matches no allowed pattern (or
when the report is missing or holds no test), 0 otherwise.
"""
import argparse
import collections
import os
import re
import sys
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTEST_SKIP = re.compile(r"^SKIPPED \[(\d+)\] ([^\n]*?): ([^\n]*)$", re.M)
GTEST_SKIP = re.compile(r"Skipped\n(.*?)\n?\[  SKIPPED \]", re.S)


def load_allowed(path):
    allowed = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            pattern, _, why = line.partition("\t")
            if not why:
                sys.exit(f"{path}:{n}: expected 'regex<TAB>why allowed', got {line!r}")
            allowed.append((re.compile(pattern), why))
    return allowed


def skips_in(junit):
    """(test name, reason, count) for every skip in the report, and the number of tests."""
    root = ET.parse(junit).getroot()
    cases = root.iter("testcase")
    found, total = [], 0
    for case in cases:
        total += 1
        name = case.get("name", "?")
        out = "".join(e.text or "" for e in case.iter("system-out"))
        if case.find("skipped") is not None or case.get("status") == "notrun":
            m = GTEST_SKIP.search(out)
            reason = " ".join(m.group(1).split()) if m else (
                case.find("skipped").get("message", "") if case.find("skipped") is not None else "")
            found.append((name, reason or "(no reason printed)", 1))
        for m in PYTEST_SKIP.finditer(out):
            found.append((f"{name}: {m.group(2)}", m.group(3).strip(), int(m.group(1))))
    return found, total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit", help="ctest's --output-junit file")
    p.add_argument("--allowed", default=os.path.join(REPO, "tests", "allowed_skips.txt"))
    a = p.parse_args()
    if not os.path.isfile(a.junit):
        sys.exit(f"check_skips: no JUnit report at {a.junit} (did ctest run with --output-junit?)")
    allowed = load_allowed(a.allowed)
    found, total = skips_in(a.junit)
    if total == 0:
        sys.exit(f"check_skips: {a.junit} holds no test")
    by_reason = collections.Counter()
    bad = []
    for name, reason, count in found:
        by_reason[reason] += count
        if not any(rx.search(reason) for rx, _ in allowed):
            bad.append((name, reason, count))
    n = sum(by_reason.values())
    print(f"[skips] {n} skipped of {total} ctest tests" + (":" if n else " (none)"))
    for reason, count in by_reason.most_common():
        print(f"[skips]   {count:4d} x {reason}")
    if bad:
        print(f"[skips] FAILED: {sum(c for _, _, c in bad)} skip(s) for a reason {os.path.relpath(a.allowed, REPO)} "
              "does not allow (a test that needs something absent must fail naming it):")
        for name, reason, count in bad:
            print(f"[skips]   {name}: {reason}" + (f" (x{count})" if count > 1 else ""))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
