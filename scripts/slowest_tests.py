#!/usr/bin/env python3
"""The slowest tests of a build tree's last ctest run, and their share of the whole, so the suite's cost stays
visible (make test prints them at the end). Usage: slowest_tests.py BUILD_DIR [N]"""
import os
import re
import sys


def last_run(build):
    """[(seconds, name)] from BUILD/Testing/Temporary/LastTest.log, or [] when ctest has not run there."""
    path = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(path):
        return []
    out, name = [], None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"^\d+/\d+ Test: (.+)$", line)
        if m:
            name = m.group(1).strip()
            continue
        m = re.match(r"^Test time =\s*([0-9.]+) sec", line)
        if m and name:
            out.append((float(m.group(1)), name))
            name = None
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: slowest_tests.py BUILD_DIR [N]")
    build, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
    times = sorted(last_run(build), reverse=True)
    if not times:
        print(f"slowest tests: no ctest run recorded in {build}")
        return
    total = sum(t for t, _ in times)
    print(f"slowest tests of {len(times)} in {build} ({total:.0f} s in all):")
    for t, name in times[:n]:
        print(f"  {t:8.1f} s  {100 * t / total:4.1f}%  {name}")


if __name__ == "__main__":
    main()
