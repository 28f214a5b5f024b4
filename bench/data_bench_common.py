"""What the data-strategy benches (semi_supervised.py, leakage_bench.py, filter_bench.py) share: running one
anvil command as a timed step, JSONL files, the result file."""
import json
import subprocess
import sys
import time


def step(args, what=""):
    """Runs `args`, prints its time and `what`; exits with its output when it fails."""
    t = time.time()
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    print(f"  {time.time() - t:6.1f} s  {what}", flush=True)
    return r


def write_jsonl(path, recs):
    """Writes through a temporary file and a rename, so that a process reading `path` meanwhile (another bench
    process sharing the work directory) sees the old file or the new one, whole."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in recs))


def write_text(path, text):
    import os
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def report(result, out):
    """Prints the result, and writes it to `out` where given."""
    print(json.dumps(result, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


def parse_args(work, **extra):
    """The benches' flags: --anvil, --work (default `work`), --out, --threads, and `extra` as name=default
    (--name, its type the default's). Returns the parsed flags, the anvil binary's absolute path and the work
    directory, created."""
    import argparse
    import os
    ap = argparse.ArgumentParser()
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--work", default=work)
    ap.add_argument("--out", default="")
    ap.add_argument("--threads", default="0")
    for name, default in extra.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    return a, os.path.abspath(a.anvil), a.work
