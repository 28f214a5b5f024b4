"""Helpers for the tests under mpirun: the launch command, its environment (shared memory between the ranks
of this machine, oversubscribed cores) and the skip when Open MPI or anvil's MPI plugin is missing."""
import json
import os
import shutil
import subprocess
import tempfile


def mpirun_cmd(n=None):
    cmd = ["mpirun", "--oversubscribe"] + (["-np", str(n)] if n else [])
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def mpi_env(extra=None):
    return dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none",
                OMPI_MCA_rmaps_base_oversubscribe="1", **(extra or {}))


def run(n, args, env=None, timeout=120):
    return subprocess.run(mpirun_cmd(n) + list(args), capture_output=True, text=True, errors="replace",
                          env=mpi_env(env), timeout=timeout)


def missing(plugin):
    """Why these tests cannot run here (printed as SKIPPED, exit 77), or None."""
    if not shutil.which("mpirun"):
        return "mpirun not found (apt-get install openmpi-bin)"
    if not os.path.exists(plugin):
        return f"{plugin} was not built (apt-get install libopenmpi-dev, then rebuild)"
    return None


def losses(out):
    """{step: loss} of a run directory's metrics.jsonl."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def worst(a, b):
    """The largest relative difference over the steps both have (inf when they share none), and their number.
    A step without loss targets logs a null loss: equal when both runs have none, inf when only one has."""
    steps = sorted(set(a) & set(b))

    def diff(s):
        if a[s] is None or b[s] is None:
            return 0.0 if a[s] is None and b[s] is None else float("inf")
        return abs(a[s] - b[s]) / max(abs(b[s]), 1e-30)

    return max((diff(s) for s in steps), default=float("inf")), len(steps)


def training_workdir(anvil, prefix):
    """For the training tests under mpirun: None after printing SKIPPED where mpirun or the MPI plugin beside
    `anvil` (or $ANVIL_MPI_PLUGIN) is missing; otherwise a fresh temporary directory, made the working one."""
    plugin = os.environ.get("ANVIL_MPI_PLUGIN", os.path.join(os.path.dirname(os.path.abspath(anvil)),
                                                             "libanvil_mpi.so"))
    if why := missing(plugin):
        print("SKIPPED: " + why)
        return None
    tmp = tempfile.mkdtemp(prefix=prefix)
    os.chdir(tmp)
    return tmp
