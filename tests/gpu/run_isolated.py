#!/usr/bin/env python3
"""Runs a GoogleTest binary so that one broken test cannot hide the others' results: the first contact of
a never-run CUDA backend with a card, where one kernel's illegal address (a "sticky" CUDA error that ruins
the process's context for every later test), a crash or a hang would otherwise end the whole run.

  run_isolated.py BINARY [--filter F] [--budget S] [--test-timeout S] [--json FILE] [-- extra gtest flags]

The binary runs over the tests still to run; when it dies (a signal, an exit other than 0 or 1), when a test
fails with a sticky CUDA error in its output, or when one test runs past --test-timeout, the test at fault is
recorded (crashed, sticky, hung) and a fresh process runs the rest. Past --budget seconds the test running is
recorded as cut off and the rest as not run. Every test's outcome and the end of its output go to --json; a
table of what did not pass is printed last. Exit 0 when every test passed (or skipped), 1 otherwise, 77 when
the binary says it has no device (the GPU tests' skip).
"""
import argparse
import collections
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

# CUDA errors after which a context is unusable: every later call in the process fails with the same error
STICKY = re.compile(r"illegal memory access|unspecified launch failure|misaligned address|illegal instruction|"
                    r"hardware stack error|invalid program counter|cudaErrorLaunchFailure|operation not permitted "
                    r"when stream is capturing|device-side assert")
RUN = re.compile(r"^\[ RUN      \] (\S+)")
END = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+) \((\d+) ms\)")


def list_tests(binary, flt):
    r = subprocess.run([binary, "--gtest_list_tests", f"--gtest_filter={flt}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run_isolated: {binary} --gtest_list_tests failed ({r.returncode}): {r.stderr[-2000:]}")
    tests, suite = [], None
    for line in r.stdout.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        name = line.split("#")[0].strip()
        if not line.startswith(" "):
            suite = name
        elif suite:
            tests.append(suite + name)
    return tests


class Runner:
    def __init__(self, a):
        self.a = a
        self.results = {}  # test -> {"status", "ms", "tail"}
        self.deadline = time.monotonic() + a.budget
        self.log = open(a.log, "w") if a.log else None

    def record(self, test, status, ms, lines):
        tail = [l for l in lines if l.strip()][-self.a.tail:]
        self.results[test] = {"status": status, "ms": ms, "tail": tail}

    def run_once(self, remaining):
        """Runs the tests `remaining` in one process; returns when it ends or is stopped, having recorded what it
        learnt."""
        cmd = [self.a.binary, "--gtest_filter=" + ":".join(remaining)] + self.a.extra
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        fd = p.stdout.fileno()
        current, lines, started, sticky, stop = None, [], 0.0, False, None
        preamble, pending, eof = [], b"", False
        while not eof:
            now = time.monotonic()
            if now > self.deadline:
                stop = "cut off"
            elif current and now - started > self.a.test_timeout:
                stop = "hung"
            if stop:
                os.killpg(p.pid, signal.SIGKILL)
                break
            # raw reads: a buffered reader would hold lines that select() no longer reports
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            eof = chunk == b""
            pending += chunk
            *complete, pending = pending.split(b"\n")
            if eof and pending:
                complete.append(pending)
            for raw in complete:
                line = raw.decode("utf-8", "replace")
                if self.log:
                    self.log.write(line + "\n")
                print(line, flush=True)
                m = RUN.match(line)
                if m:
                    current, lines, started, sticky = m.group(1), [], time.monotonic(), False
                    continue
                m = END.match(line)
                if m and current == m.group(2):
                    status = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[m.group(1)]
                    if status == "failed" and sticky:
                        status = "sticky"
                    self.record(current, status, int(m.group(3)), lines)
                    current = None
                    if status == "sticky":  # the context is gone: a fresh process for the rest
                        os.killpg(p.pid, signal.SIGKILL)
                        eof = True
                        break
                    continue
                if current:
                    lines.append(line)
                    if STICKY.search(line):
                        sticky = True
                else:
                    preamble.append(line)
        if self.log:
            self.log.flush()
        p.wait()
        p.stdout.close()
        if p.returncode == 77 and not self.results:
            return "no device"
        if current:  # died, hung or cut off inside a test
            ms = int(1000 * (time.monotonic() - started))
            if stop is None:
                sig = -p.returncode if p.returncode < 0 else None
                lines.append(f"(process ended: {signal.Signals(sig).name if sig else 'exit ' + str(p.returncode)})")
            self.record(current, stop or "crashed", ms, lines)
        elif p.returncode not in (0, 1) and stop is None and not any(t in self.results for t in remaining):
            # died before its first test: nothing would change on a retry
            self.record(remaining[0], "crashed", 0,
                        preamble + [f"(process ended with {p.returncode} before a test)"])
        return stop

    def run(self, tests):
        while True:
            remaining = [t for t in tests if t not in self.results]
            if not remaining:
                return None
            why = self.run_once(remaining)
            if why in ("no device", "cut off"):
                for t in tests:
                    self.results.setdefault(t, {"status": "not run", "ms": 0, "tail": []})
                return why


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("binary")
    p.add_argument("--filter", default="*")
    p.add_argument("--budget", type=float, default=600, help="seconds for the whole run")
    p.add_argument("--test-timeout", type=float, default=120, help="seconds one test may run")
    p.add_argument("--json", help="every test's outcome")
    p.add_argument("--log", help="the binaries' whole output")
    p.add_argument("--tail", type=int, default=12, help="lines of a failing test's output kept")
    p.add_argument("extra", nargs="*", help="further gtest flags (after --)")
    a = p.parse_args()
    tests = list_tests(a.binary, a.filter)
    if not tests:
        print(f"run_isolated: no test matches {a.filter}")
        return 1
    r = Runner(a)
    t0 = time.monotonic()
    why = r.run(tests)
    if why == "no device":
        print("run_isolated: the binary has no device to run on (exit 77)")
        return 77
    counts = collections.Counter(r.results[t]["status"] for t in tests)
    summary = {"binary": a.binary, "filter": a.filter, "seconds": round(time.monotonic() - t0, 1),
               "counts": dict(counts), "tests": {t: r.results[t] for t in tests}}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    bad = [t for t in tests if r.results[t]["status"] not in ("passed", "skipped")]
    print(f"\n== {len(tests)} tests in {summary['seconds']} s: "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for t in bad:
        res = r.results[t]
        print(f"{res['status'].upper():8} {t} ({res['ms']} ms)")
        for line in res["tail"][-4:]:
            print(f"         {line[:200]}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
