#!/usr/bin/env python3
"""run_isolated.py against a fake GoogleTest binary whose tests pass, fail, crash, hang and hit a sticky CUDA
error: every test gets its own outcome, the ones after a crash or a sticky error still run (in a fresh
process), and a test that runs in a process after a sticky error is not blamed for it."""
import json
import os
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# A stand-in for a gtest binary: --gtest_list_tests and --gtest_filter=A:B:... (positive names only).
# State that would survive a sticky error lives in a file: once "poisoned", every later test in the same
# process fails as a real CUDA context would.
FAKE = r'''#!/usr/bin/env python3
import os, sys, time
TESTS = {"Ops.Pass1": "pass", "Ops.Fail": "fail", "Ops.Crash": "crash", "Ops.Pass2": "pass",
         "Ops.Sticky": "sticky", "Ops.AfterSticky": "pass", "Model.Hang": "hang", "Model/P.Last/0": "pass"}
args = dict(a.split("=", 1) if "=" in a else (a, "") for a in sys.argv[1:])
if "--gtest_list_tests" in args:
    print("Running main() from fake")
    suites = {}
    for t in TESTS:
        s, n = t.rsplit(".", 1)
        suites.setdefault(s, []).append(n)
    for s, ns in suites.items():
        print(s + ".")
        for n in ns:
            print("  " + n + ("  # GetParam() = 0" if "/" in s else ""))
    sys.exit(0)
if os.environ.get("FAKE_NO_DEVICE"):
    print("SKIPPED: no usable CUDA device")
    sys.exit(77)
requested = args["--gtest_filter"].split(":")
with open(os.environ["FAKE_RUNS"], "a") as f:
    f.write(",".join(requested) + "\n")
poisoned, failed = False, 0
for t in TESTS:
    if t not in requested:
        continue
    print("[ RUN      ] " + t, flush=True)
    kind = TESTS[t]
    if poisoned:
        print("cuda_backend.cpp:12: CUDA error: an illegal memory access was encountered")
        print("[  FAILED  ] " + t + " (1 ms)", flush=True)
        failed += 1
        continue
    if kind == "crash":
        os.abort()
    if kind == "hang":
        time.sleep(60)
    if kind == "sticky":
        print("attention.cu:99: CUDA error: an illegal memory access was encountered")
        poisoned = True
    if kind in ("fail", "sticky"):
        print("expected 1, got 2")
        print("[  FAILED  ] " + t + " (3 ms)", flush=True)
        failed += 1
    else:
        print("[       OK ] " + t + " (2 ms)", flush=True)
sys.exit(1 if failed else 0)
'''


def main():
    tmp = tempfile.mkdtemp(prefix="anvil-run-isolated-")
    fake = os.path.join(tmp, "fake_tests")
    with open(fake, "w") as f:
        f.write(FAKE)
    os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
    runs = os.path.join(tmp, "runs.txt")
    env = dict(os.environ, FAKE_RUNS=runs)
    out = os.path.join(tmp, "out.json")
    r = subprocess.run([sys.executable, os.path.join(HERE, "run_isolated.py"), fake, "--test-timeout", "3",
                        "--json", out], capture_output=True, text=True, env=env, timeout=120)
    print(r.stdout[-3000:], r.stderr[-2000:])
    res = json.load(open(out))["tests"]
    want = {"Ops.Pass1": "passed", "Ops.Fail": "failed", "Ops.Crash": "crashed", "Ops.Pass2": "passed",
            "Ops.Sticky": "sticky", "Ops.AfterSticky": "passed", "Model.Hang": "hung", "Model/P.Last/0": "passed"}
    problems = [f"{t}: {res[t]['status']}, want {s}" for t, s in want.items() if res[t]["status"] != s]
    if r.returncode != 1:
        problems.append(f"exit {r.returncode}, want 1 (some tests did not pass)")
    if "expected 1, got 2" not in res["Ops.Fail"]["tail"]:
        problems.append("the failing test's output is not kept")
    if "SIGABRT" not in " ".join(res["Ops.Crash"]["tail"]):
        problems.append("the crash's signal is not named")
    n_runs = len(open(runs).read().splitlines())
    if n_runs != 4:  # the first run, after the crash, after the sticky error, after the hang
        problems.append(f"{n_runs} processes, want 4")
    for line in ("CRASHED  Ops.Crash", "STICKY   Ops.Sticky", "HUNG     Model.Hang", "FAILED   Ops.Fail"):
        if line not in r.stdout:
            problems.append(f"the table lacks '{line}'")

    # the budget: the hang is cut off, what follows it is not run
    r = subprocess.run([sys.executable, os.path.join(HERE, "run_isolated.py"), fake, "--filter", "Model*",
                        "--budget", "2", "--json", out], capture_output=True, text=True, env=env, timeout=60)
    res = json.load(open(out))["tests"]
    if (res["Model.Hang"]["status"], res["Model/P.Last/0"]["status"]) != ("cut off", "not run"):
        problems.append(f"budget: {res['Model.Hang']['status']}, {res['Model/P.Last/0']['status']}; "
                        "want cut off, not run")

    # no device: exit 77, the GPU tests' skip
    r = subprocess.run([sys.executable, os.path.join(HERE, "run_isolated.py"), fake],
                       capture_output=True, text=True, env=dict(env, FAKE_NO_DEVICE="1"), timeout=60)
    if r.returncode != 77:
        problems.append(f"no device: exit {r.returncode}, want 77")

    for p in problems:
        print("FAILED: " + p)
    print("run_isolated: " + ("ok" if not problems else f"{len(problems)} problems"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
