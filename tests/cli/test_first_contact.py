#!/usr/bin/env python3
"""What a new user stumbled on (issue 15), one check group per stumble:

1. --json alone prints JSON to stdout; --json FILE prints the text and writes the file (bench, doctor, eval);
   --version and doctor name the version and commit; the binary links none of CUDA's large libraries, so a
   command that never touches a GPU starts at once (they are loaded when the CUDA backend is made).
2. Re-running the first command with --resume added works; an architecture flag that differs is refused,
   naming both values.
3. data prepare counts records in one unit: records in = kept + rejected + duplicates in the summary line,
   report.json and rejects.jsonl, and invalid UTF-8 rejects say how many bytes were dropped.
4. A launch under MPI or Slurm is refused; two processes never write one run directory (anvil.lock).
5. Temporary checkpoints left by a crash (kill -9) are removed on the next start, and never count toward
   --keep-checkpoints.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import ANVIL, ONE_LINE_ERROR, TINY, TempDir, check, report, run, text_file, tiny_model  # noqa: E402


def last_line(r):
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def version(doctor, f):
    """anvil --version names the version and the commit built; doctor reports the same."""
    r = run(["--version"])
    m = re.fullmatch(r"anvil (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}(-dirty)?|unknown)(, \d{4}-\d\d-\d\d)?\)\n",
                     r.stdout)
    check(r.returncode == 0 and m is not None, f"anvil --version: {r.stdout.strip()!r}", f)
    check(m is not None and doctor.get("anvil") == r.stdout.strip()[len("anvil "):],
          "anvil doctor --json names the same version", f)


def no_gpu_library_at_start(f):
    """cuBLASLt (540 MB, about 0.35 s of static initialisers), cuDNN and NCCL are loaded at run time by the
    CUDA backend, never named in the binary's dynamic section."""
    readelf = shutil.which("readelf")
    if readelf is None:
        print("  (readelf not found: the dynamic-section check is left out)")
        return
    r = subprocess.run([readelf, "-d", ANVIL], capture_output=True, text=True)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)
    heavy = [n for n in needed if re.match(r"lib(cublas|cudnn|nccl|cufft|cusparse|curand)", n)]
    check(r.returncode == 0 and needed and not heavy,
          f"the binary needs none of CUDA's large libraries at start ({len(needed)} needed; {heavy or 'none'} of them)",
          f)


def json_flag(d, f):
    r = run(["bench", "--device", "cpu", "--quick", "--json"])
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    check(r.returncode == 0 and j.get("device", {}).get("kind") == "cpu", "bench --json alone: JSON on stdout", f)
    path = os.path.join(d, "bench.json")
    r = run(["bench", "--device", "cpu", "--quick", "--json", path])
    check(r.returncode == 0 and "matmul_fp32" in r.stdout and not r.stdout.lstrip().startswith("{"),
          "bench --json FILE: the table on stdout", f)
    check(os.path.exists(path) and json.load(open(path))["device"]["kind"] == "cpu", "bench --json FILE: the file", f)

    r = run(["doctor", "--json"])
    check(r.returncode == 0 and "cpu" in json.loads(r.stdout), "doctor --json alone: JSON on stdout", f)
    path = os.path.join(d, "doctor.json")
    r = run(["doctor", "--json", path])
    check(r.returncode == 0 and r.stdout.startswith("anvil ") and "\nCPU:" in r.stdout and
          "cpu" in json.load(open(path)), "doctor --json FILE: text on stdout, JSON in the file", f)
    version(json.load(open(path)), f)

    model = tiny_model(d)
    data = os.path.join(d, "tiny.txt")
    r = run(["eval", "--model", model, "--data", data, "--max-batches", "2", "--json"], check=True)
    check("loss" in json.loads(r.stdout), "eval --json alone: JSON on stdout", f)
    path = os.path.join(d, "eval.json")
    r = run(["eval", "--model", model, "--data", data, "--max-batches", "2", "--json", path], check=True)
    check(r.stdout.startswith("loss ") and "ppl" in json.load(open(path)), "eval --json FILE", f)
    for cmd in (["bench"], ["doctor"], ["eval"]):
        h = run([*cmd, "--help"]).stdout
        check(re.search(r"--json \[FILE\]", h) is not None, f"{cmd[0]} --help shows --json [FILE]", f)
    r = run(["bench", "--device", "cuda", "--quick"])
    if r.returncode == 0:
        print("note: a CUDA device is usable here; the no-device bench error is not exercised")
    else:
        check(r.returncode == 1 and "matmul" not in r.stdout and ONE_LINE_ERROR.match(last_line(r)) is not None
              and "--device cuda" in last_line(r), "bench --device cuda without a usable GPU: a one-line error", f)


def resume_same_command(d, f):
    data = text_file(d, "resume.txt")
    out = os.path.join(d, "first")
    first = ["train", "--data", data, "--out", out, "--save-every", "2", *TINY]
    run([*first, "--steps", "4"], check=True)
    r = run([*first, "--steps", "6", "--resume", out])
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    check(r.returncode == 0 and rows[-1]["step"] == 6, "the first command plus --resume continues the run", f)
    r = run(["train", "--resume", out, "--steps", "8", "--layers", "3", "--dim", "16"])
    msg = last_line(r)
    check(r.returncode == 1 and ONE_LINE_ERROR.match(msg) is not None and "--layers 3" in msg and "--layers 2" in msg,
          f"a different --layers is refused naming both values ({msg})", f)
    r = run(["train", "--resume", out, "--steps", "8", "--batch", "auto"])
    check(r.returncode == 0 and "keeping the batch" in r.stderr, "--batch auto on resume keeps the chosen batch", f)


def prepare_counts(d, f):
    # ~3.4 MB of text: four 1 MiB chunks, two of them holding a Latin-1 byte
    txt = os.path.join(d, "corpus.txt")
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    parts = []
    for i in range(4):
        parts.append(" ".join(words[(i * 7 + k * 3 + k // 5) % 5] for k in range(140000)).encode())
        if i in (1, 3):
            parts.append(b"caf\xe9")
    with open(txt, "wb") as fh:
        fh.write(b" ".join(parts))
    jl = os.path.join(d, "mixed.jsonl")
    with open(jl, "wb") as fh:
        fh.write(b'{"text": "one"}\n{"text": "one"}\n{"text": 5}\n{"text": "bad \xff"}\n{"text": "two"}\n')
    out = os.path.join(d, "prep")
    r = run(["data", "prepare", "--in", txt, jl, "--out", out, "--val-fraction", "0.2"])
    both = r.stdout + r.stderr
    m = re.search(r"(\d+) records in = (\d+) kept \+ (\d+) rejected \+ (\d+) duplicates", both)
    check(r.returncode == 0 and m is not None, "summary line: records in = kept + rejected + duplicates", f)
    if not m:
        print(both)
        return
    n_in, kept, rej, dup = map(int, m.groups())
    rep = json.load(open(os.path.join(out, "report.json")))
    rejects = [json.loads(l) for l in open(os.path.join(out, "rejects.jsonl"))]
    split_records = sum(s["records"] for s in rep["splits"].values())
    check(n_in == kept + rej + dup and (n_in, kept, rej, dup) == (
        rep["records_in"], rep["kept"], rep["rejected_total"], rep["duplicates_removed"]),
        f"summary and report.json agree and add up ({n_in} = {kept} + {rej} + {dup})", f)
    check(split_records == kept, f"the splits' records are the kept records ({split_records})", f)
    check(len(rejects) == rej + dup, f"rejects.jsonl lists every rejected record and duplicate ({len(rejects)})", f)
    for name, c in rep["inputs"].items():
        check(c["records_in"] == c["kept"] + c["rejected"] + c["duplicates"], f"per-file counts add up ({name})", f)
    chunks = [x for x in rejects if x["file"] == txt]
    check(len(chunks) == 2 and all(x["reason"] == "invalid_utf8" and x["bytes"] > 100000 and
                                   f"({x['bytes']} bytes)" in x["detail"] for x in chunks),
          "a text chunk with invalid UTF-8 says how many bytes were dropped", f)
    check(sum(x["bytes"] for x in rejects) == rep["bytes_dropped"], "bytes_dropped is the rejects' sum", f)
    check(rep["inputs"][txt]["records_in"] == 4 and "chunk" in rep["record"],
          f"a text file's records are its chunks ({rep['inputs'][txt]['records_in']})", f)


def one_writer(d, f):
    data = text_file(d, "lock.txt", n_words=20000)
    for env in ({"OMPI_COMM_WORLD_SIZE": "2"}, {"SLURM_STEP_NUM_TASKS": "4"}, {"PMI_SIZE": "2"}):
        out = os.path.join(d, "mpi")
        r = subprocess.run([ANVIL, "train", "--data", data, "--out", out, "--steps", "2", *TINY],
                           capture_output=True, text=True, env={**os.environ, **env})
        var = next(iter(env))
        check(r.returncode == 1 and var in last_line(r) and not os.path.exists(out),
              f"a launch with {var} set is refused before writing anything", f)
    mpirun = shutil.which("mpirun")
    if mpirun and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(ANVIL)), "libanvil_mpi.so")):
        out = os.path.join(d, "mpirun")
        r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", ANVIL, "train", "--data",
                            data, "--out", out, "--steps", "2", "--log-every", "1", *TINY], capture_output=True,
                           text=True, timeout=120,
                           env={**os.environ, "OMPI_MCA_btl": "self,vader",
                                "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
        lines = open(os.path.join(out, "metrics.jsonl")).read().splitlines() if r.returncode == 0 else []
        check(r.returncode == 0 and len(lines) == 2 and r.stderr.count("anvil: data parallel over 2 ranks") == 1,
              f"mpirun -np 2 anvil train: one job, one writer ({len(lines)} metrics lines)", f)
    else:
        print("note: mpirun not installed; the real mpirun launch is not exercised")

    out = os.path.join(d, "locked")
    slow = ["train", "--data", data, "--out", out, "--steps", "100000", "--save-every", "1", "--log-every", "1",
            "--keep-checkpoints", "2", *TINY]
    p = subprocess.Popen([ANVIL, *slow], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        metrics = os.path.join(out, "metrics.jsonl")
        while time.time() < deadline and not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3):
            time.sleep(0.05)
        lock = open(os.path.join(out, "anvil.lock")).read()
        check(f"pid {p.pid}" in lock, f"anvil.lock names the owner ({lock.strip()})", f)
        r = run(["train", "--data", data, "--out", out, "--steps", "5", *TINY])
        check(r.returncode == 1 and f"pid {p.pid}" in last_line(r), "a second run into the same --out is refused", f)
        r = run(["train", "--resume", out, "--steps", "100001"])
        check(r.returncode == 1 and f"pid {p.pid}" in last_line(r), "resuming a run that is still going is refused", f)
        time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)  # a crash, possibly in the middle of a save
        p.wait()
    return out


def stale_temporaries(out, f):
    # whatever kill -9 left, plus one planted large temporary of a writer that is gone
    planted = os.path.join(out, "checkpoint-999999.tmp.4194304")
    os.makedirs(planted, exist_ok=True)
    with open(os.path.join(planted, "model.safetensors"), "wb") as fh:
        fh.write(b"\0" * 3_000_000)
    before = [n for n in os.listdir(out) if ".tmp." in n]
    done = max(json.loads(l)["step"] for l in open(os.path.join(out, "metrics.jsonl")))
    r = run(["train", "--resume", out, "--steps", str(done + 3)])
    names = os.listdir(out)
    check(r.returncode == 0, f"the crashed run resumes (exit {r.returncode}) {last_line(r)}", f)
    check("stale temporar" in r.stderr and "checkpoint-999999.tmp.4194304" in r.stderr,
          f"the start says what it removed ({len(before)} temporaries)", f)
    check(not any(".tmp." in n or ".old." in n for n in names), f"no temporaries left ({sorted(names)})", f)
    ckpts = [n for n in names if re.fullmatch(r"checkpoint-\d+", n)]
    check(len(ckpts) == 2, f"--keep-checkpoints 2 keeps two real checkpoints ({sorted(ckpts)})", f)
    check(not os.path.exists(os.path.join(out, "anvil.lock")), "the lock file is gone after a clean exit", f)


def main():
    f = []
    no_gpu_library_at_start(f)
    with TempDir() as d:
        json_flag(d, f)
        resume_same_command(d, f)
        prepare_counts(d, f)
        out = one_writer(d, f)
        stale_temporaries(out, f)
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
