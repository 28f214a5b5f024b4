#!/usr/bin/env python3
"""The job's collectives (src/dist/comm.h) as one process and as two under Open MPI's mpirun:

  1. one process (no launcher): a Comm of size 1, every collective the identity;
  2. `mpirun -np 2`: float all-reduces started together and waited in reverse order, a double all-reduce,
     all-gather, broadcast, barrier, and the start-up agreement check naming the rank that differs;
  3. a rank that stops (SIGSTOP) before an all-reduce: the other rank gives up after --comm-timeout with an
     error naming itself and the collective, and the whole job exits non-zero within the deadline + 30 s;
  4. a launch whose MPI plugin cannot be loaded: an error saying what to install.
Skips (exit 77) where mpirun or the plugin is missing.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check as check_line, report  # noqa: E402
import mpi  # noqa: E402

CHECK = os.environ["ANVIL_COMM_CHECK"]
PLUGIN = os.environ["ANVIL_MPI_PLUGIN"]


def mpirun(n, *args, env=None, timeout=120):
    return mpi.run(n, args, env=env, timeout=timeout)


def main():
    if why := mpi.missing(PLUGIN):
        print("SKIPPED: " + why)
        return 77
    failures = []

    def check(cond, msg):
        check_line(cond, msg, failures)

    r = subprocess.run([CHECK, "basic"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "rank 0 of 1 (local rank 0, single): ok" in r.stdout,
          f"one process: size 1 without MPI ({r.stdout.strip()} {r.stderr.strip()})")

    r = mpirun(2, CHECK, "basic")
    lines = sorted(x for x in r.stdout.splitlines() if x.startswith("rank"))
    check(r.returncode == 0 and lines == ["rank 0 of 2 (local rank 0, mpi): ok", "rank 1 of 2 (local rank 1, mpi): ok"],
          f"two ranks: all-reduce, all-gather, broadcast, barrier, agreement check ({lines} {r.stderr.strip()[-300:]})")

    t0 = time.time()
    r = mpirun(2, CHECK, "stall", "5", timeout=120)
    took = time.time() - t0
    check(r.returncode != 0 and "anvil: rank 0: error: the all-reduce a stopped rank never joins did not complete "
          "within 5 s (--comm-timeout)" in r.stderr and took < 5 + 30,
          f"a stopped rank: the job exits {r.returncode} after {took:.1f} s naming the rank and the collective "
          f"({[x for x in r.stderr.splitlines() if 'error' in x][:1]})")

    r = mpirun(2, CHECK, "basic", env={"ANVIL_MPI_PLUGIN": "/nonexistent/libanvil_mpi.so"})
    check(r.returncode != 0 and "the MPI plugin /nonexistent/libanvil_mpi.so cannot be loaded" in r.stderr and
          "libopenmpi-dev" in r.stderr, "a launch without the plugin says what to install")

    return report(failures, "PASSED: the job's collectives, their deadline and their errors")


if __name__ == "__main__":
    sys.exit(main())
