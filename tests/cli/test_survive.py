#!/usr/bin/env python3
"""Runs that survive: checkpoint manifests, damaged checkpoints, a full disk during a save, --resume auto.

A: every checkpoint's trainer_state.json lists its other files with their sizes and CRC-32, and Python's zlib
   agrees with every one.
B: the newest checkpoint damaged (a byte of its optimizer state changed): resuming the run directory names it,
   skips it, and continues from the one before; naming the damaged checkpoint itself is a one-line error. A
   truncated model.safetensors is named with its size.
C: a full disk (a small tmpfs; root only, else skipped and said) while checkpoint-8 is written: the run stops
   with a clear error, nothing half-written is left, and checkpoint-4 is whole (its manifest holds).
D: --resume auto: with no run directory it starts the run; killed with SIGKILL after checkpoint-20, the same
   command continues from it and ends with final weights equal, bit for bit, to an uninterrupted run's; an
   attempt that died before its first checkpoint has its metrics.jsonl kept aside and the run starts over.
E: --max-restarts 2: the training process (the supervisor's child) killed with SIGKILL after checkpoint-20 is
   restarted from its newest checkpoint and ends with the uninterrupted run's final weights, bit for bit; the
   restart is a record in metrics.jsonl and in summary.json; with the supervisor killed outright, the worker
   saves a checkpoint and exits; a negative count is a one-line error.
F: prepared data keeps its shards' sizes and CRC-32 in meta.json: a changed byte in a shard stops the run
   before it starts, with a one-line error naming the shard.
"""
import glob
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(__file__))
from common import ANVIL, ONE_LINE_ERROR, TempDir, check, report, run, text_file  # noqa: E402

ARGS = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq", "32", "--batch", "4", "--lr", "3e-3",
        "--log-every", "1", "--threads", "2", "--seed", "5"]


def manifest_problems(ckpt):
    state = json.load(open(os.path.join(ckpt, "trainer_state.json")))
    files = state.get("files", {})
    listed = sorted(files)
    present = sorted(f for f in os.listdir(ckpt) if f != "trainer_state.json")
    out = [] if listed == present else [f"{ckpt}: manifest lists {listed}, the directory holds {present}"]
    for name, want in files.items():
        data = open(os.path.join(ckpt, name), "rb").read()
        if len(data) != want["bytes"] or f"{zlib.crc32(data):08x}" != want["crc32"]:
            out.append(f"{ckpt}/{name}: {len(data)} bytes crc {zlib.crc32(data):08x}, manifest {want}")
    return out


def last_error_line(r):
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def part_ab(d, data, failures):
    a = os.path.join(d, "a")
    run(["train", "--data", data, "--out", a, "--steps", "12", "--save-every", "4", *ARGS], check=True)
    ckpts = sorted(glob.glob(os.path.join(a, "checkpoint-*"))) + [os.path.join(a, "final")]
    for c in ckpts:
        for p in manifest_problems(c):
            failures.append("A: " + p)
    print(f"A: {len(ckpts)} checkpoints, every manifest matches zlib's CRC-32")

    # B: damage the newest (final, step 12): one byte of its optimizer state
    opt = os.path.join(a, "final", "optimizer.safetensors")
    blob = bytearray(open(opt, "rb").read())
    blob[len(blob) // 2] ^= 0x40
    open(opt, "wb").write(bytes(blob))
    r = run(["train", "--resume", a, "--out", os.path.join(d, "b"), "--steps", "14"])
    check(r.returncode == 0, f"B: a run directory whose final/ is damaged resumes (exit {r.returncode})", failures)
    check(re.search(r"skipping \S*final, which is damaged \(optimizer\.safetensors: CRC-32", r.stderr),
          "B: the warning names final/optimizer.safetensors and its CRC-32", failures)
    check("checkpoint-8 at step 8" in r.stderr, "B: it resumes from the checkpoint before, checkpoint-8", failures)
    r = run(["train", "--resume", os.path.join(a, "final"), "--out", os.path.join(d, "b2"), "--steps", "14"])
    err = last_error_line(r)
    check(r.returncode != 0 and ONE_LINE_ERROR.match(err) and "damaged" in err and "optimizer.safetensors" in err,
          f"B: resuming the damaged checkpoint itself is a one-line error naming the file (exit {r.returncode}: "
          f"{err[:160]})", failures)
    model = os.path.join(a, "checkpoint-4", "model.safetensors")
    size = os.path.getsize(model)
    os.truncate(model, size // 2)
    r = run(["train", "--resume", os.path.join(a, "checkpoint-4"), "--out", os.path.join(d, "b3"), "--steps", "14"])
    err = last_error_line(r)
    check(r.returncode != 0 and f"{size // 2} bytes" in err and f"says {size}" in err,
          f"B: a truncated model.safetensors is named with both sizes (exit {r.returncode}: {err[:160]})", failures)
    print("B: a damaged newest checkpoint is skipped with a warning; naming one is a one-line error")


def part_c(d, data, failures):
    mnt = os.path.join(d, "small-disk")
    os.makedirs(mnt)
    # one checkpoint of this model takes about 0.46 MB; the disk holds the first and not the second
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", mnt], capture_output=True, text=True)
    if m.returncode != 0:
        print(f"C: skipped (mounting a tmpfs needs root: {m.stderr.strip()})")
        return
    try:
        out = os.path.join(mnt, "run")
        r = run(["train", "--data", data, "--out", out, "--steps", "12", "--save-every", "4", *ARGS])
        err = last_error_line(r)
        check(r.returncode != 0 and ONE_LINE_ERROR.match(err) and "checkpoint-8" in err
              and "earlier checkpoints are untouched" in err,
              f"C: a full disk during a save is a one-line error naming the checkpoint (exit {r.returncode}: "
              f"{err[:160]})", failures)
        left = sorted(os.listdir(out))
        check(not [n for n in left if ".tmp." in n or ".old." in n], f"C: nothing half-written is left ({left})",
              failures)
        check(os.path.isdir(os.path.join(out, "checkpoint-4")), "C: checkpoint-4 is still there", failures)
        if os.path.isdir(os.path.join(out, "checkpoint-4")):
            for p in manifest_problems(os.path.join(out, "checkpoint-4")):
                failures.append("C: " + p)
        print(f"C: the save at step 8 failed cleanly ({err[:110]}...); left {left}")
    finally:
        subprocess.run(["umount", mnt])


FLAGS_D = ["--steps", "400", "--save-every", "10", "--keep-checkpoints", "0", *ARGS]


def children(p):
    """The pids of a running process's children."""
    return open(f"/proc/{p.pid}/task/{p.pid}/children").read().split() if p.poll() is None else []


def same_final(ref, out):
    """Whether run directory `out` ended with `ref`'s final weights, bit for bit; and ref's md5."""
    a, b = (os.path.join(x, "final", "model.safetensors") for x in (ref, out))
    return os.path.exists(b) and md5(a) == md5(b), md5(a)


def wait_for(path, p, seconds=120):
    deadline = time.time() + seconds
    while not os.path.exists(path) and time.time() < deadline and p.poll() is None:
        time.sleep(0.01)


def part_d(d, data, ref, failures):
    flags = ["--data", data, *FLAGS_D]
    r_dir = os.path.join(d, "requeued")
    cmd = [ANVIL, "train", "--resume", "auto", "--out", r_dir, *flags]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(os.path.join(r_dir, "checkpoint-20", "trainer_state.json"), p)
    killed = p.poll() is None
    if killed:
        p.send_signal(signal.SIGKILL)
    first_err = p.communicate()[1]
    check("no checkpoint yet; starting the run in" in first_err, "D: the first attempt says it starts the run", failures)
    check(killed, "D: the first attempt is killed (SIGKILL) after checkpoint-20", failures)
    r = run(cmd[1:], timeout=300)
    check(r.returncode == 0, f"D: the same command again finishes the run (exit {r.returncode})", failures)
    m = re.search(r"continuing from \S*checkpoint-(\d+)", r.stderr)
    check(m and int(m.group(1)) >= 20, "D: it continues from the newest checkpoint", failures)
    same, digest = same_final(ref, r_dir)
    check(same, "D: its final weights equal the uninterrupted run's, bit for bit", failures)
    print(f"D: killed after checkpoint-{m.group(1) if m else '?'}; the requeued run's final weights "
          f"{'equal' if same else 'DIFFER FROM'} the uninterrupted run's (md5 {digest})")

    early = os.path.join(d, "early")
    os.makedirs(early)
    open(os.path.join(early, "metrics.jsonl"), "w").write('{"step": 1, "loss": 5.0}\n')
    r = run(["train", "--resume", "auto", "--out", early, "--data", data, "--steps", "4", *ARGS])
    check(r.returncode == 0 and os.path.exists(os.path.join(early, "metrics.before-restart.jsonl")),
          f"D: after an attempt without a checkpoint the run starts over, its log kept aside (exit "
          f"{r.returncode}, {sorted(os.listdir(early))})", failures)
    r = run(["train", "--resume", "auto", "--data", data, "--steps", "4", *ARGS])
    err = last_error_line(r)
    check(r.returncode != 0 and ONE_LINE_ERROR.match(err) and "--out" in err,
          f"D: --resume auto without --out is a one-line error asking for it ({err[:120]})", failures)
    print("D: an attempt without a checkpoint starts over (its log kept aside); --resume auto needs --out")


def part_e(d, data, ref, failures):
    out = os.path.join(d, "supervised")
    p = subprocess.Popen([ANVIL, "train", "--max-restarts", "2", "--out", out, "--data", data, *FLAGS_D],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(os.path.join(out, "checkpoint-20", "trainer_state.json"), p)
    kids = children(p)
    check(len(kids) == 1, f"E: the supervisor has one child, the worker ({len(kids)})", failures)
    for k in kids:
        os.kill(int(k), signal.SIGKILL)
    err = p.communicate(timeout=300)[1]
    check(p.returncode == 0, f"E: the supervised run finishes after the worker is killed (exit {p.returncode})",
          failures)
    check(re.search(r"the worker was killed by signal 9 \(SIGKILL[^\n]*restart 1 of 2", err),
          "E: stderr says the worker was killed by SIGKILL and restarts it (1 of 2)", failures)
    events = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"event"' in l]
    summary = json.load(open(os.path.join(out, "summary.json")))
    check(len(events) == 1 and events[0]["event"] == "restart" and events[0]["after_step"] >= 20,
          f"E: metrics.jsonl records the restart ({events})", failures)
    check(summary.get("restarts") == 1, f"E: summary.json counts it ({summary.get('restarts')})", failures)
    same, _ = same_final(ref, out)
    check(same, "E: the final weights equal the uninterrupted run's, bit for bit", failures)
    print(f"E: worker killed after step {events[0]['after_step'] if events else '?'}; restarted once; final "
          f"weights {'equal' if same else 'DIFFER FROM'} the uninterrupted run's")
    # the supervisor killed outright: its worker gets SIGTERM, saves a checkpoint and exits
    orphan = os.path.join(d, "orphan")
    p = subprocess.Popen([ANVIL, "train", "--max-restarts", "1", "--out", orphan, "--data", data, *FLAGS_D],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(os.path.join(orphan, "checkpoint-10", "trainer_state.json"), p)
    worker = children(p)
    p.kill()
    p.wait()
    gone = False
    for _ in range(300):
        gone = not worker or not os.path.exists(f"/proc/{worker[0]}") or \
            open(f"/proc/{worker[0]}/stat").read().split()[2] == "Z"
        if gone:
            break
        time.sleep(0.1)
    last = max(json.loads(l)["step"] for l in open(os.path.join(orphan, "metrics.jsonl")))
    saved = sorted(n for n in os.listdir(orphan) if n.startswith("checkpoint-"))
    check(len(worker) == 1 and gone and f"checkpoint-{last}" in saved,
          f"E: with its supervisor killed, the worker saves its last step ({last}) and exits ({saved})", failures)
    r = run(["train", "--max-restarts", "-1", "--data", data, "--steps", "2", *ARGS])
    err = last_error_line(r)
    check(r.returncode != 0 and ONE_LINE_ERROR.match(err) and "--max-restarts" in err,
          f"E: --max-restarts -1 is a one-line error ({err[:120]})", failures)


def part_f(d, data, failures):
    prep = os.path.join(d, "prepared")
    run(["data", "prepare", "--in", data, "--out", prep], check=True)
    meta = json.load(open(os.path.join(prep, "meta.json")))
    shards = sorted(meta.get("files", {}))
    check(shards and all(f"{zlib.crc32(open(os.path.join(prep, f), 'rb').read()):08x}" == meta["files"][f]["crc32"]
                         for f in shards), "F: meta.json lists every shard with zlib's CRC-32", failures)
    if not shards:
        return
    path = os.path.join(prep, shards[0])
    blob = bytearray(open(path, "rb").read())
    blob[-3] ^= 0x01
    open(path, "wb").write(bytes(blob))
    r = run(["train", "--data", prep, "--steps", "2", "--out", os.path.join(d, "f"), *ARGS])
    err = last_error_line(r)
    check(r.returncode != 0 and ONE_LINE_ERROR.match(err) and shards[0] in err and "damaged" in err,
          f"F: a changed shard stops the run with a one-line error naming it ({err[:140]})", failures)
    print(f"F: {len(shards)} shards in the manifest; a changed byte in {shards[0]} stops the run: {err[:100]}...")


def main():
    failures = []
    with TempDir() as d:
        data = text_file(d, n_words=6000)
        part_ab(d, data, failures)
        part_c(d, data, failures)
        ref = os.path.join(d, "ref")
        run(["train", "--out", ref, "--data", data, *FLAGS_D], check=True, timeout=300)
        part_d(d, data, ref, failures)
        part_e(d, data, ref, failures)
        part_f(d, data, failures)
    report(failures)


if __name__ == "__main__":
    main()
