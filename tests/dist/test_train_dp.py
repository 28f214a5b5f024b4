#!/usr/bin/env python3
"""Data-parallel training under `mpirun -np 2 --oversubscribe`, one thread per rank (issue 13's Must show):

  1. two ranks with per-rank batch B train exactly the rows of one process with batch 2B: losses within
     1e-5 relative at each of 20 steps, shuffle off and on, with accumulation, GPT-2 and Llama, LoRA;
  2. rank 0 alone writes the run directory (metrics, TensorBoard, checkpoints, summary);
  3. a 2-rank checkpoint resumes on 2 ranks bit for bit, and on 1 rank (accumulation keeps the global batch)
     within 1e-5, saying so;
  4. ranks started with different flags stop at start-up naming the rank that differs;
  5. a stopped rank (SIGSTOP) ends the job within --comm-timeout + 30 s with an error naming the rank and the
     collective;
  6. SIGUSR1 and Ctrl-C (SIGINT) on mpirun stop every rank after a consistent checkpoint, which resumes;
  7. ZeRO-1 (--zero 1): the same losses as one process, half the optimizer state per rank, its checkpoints
     resumed on 2 ranks bit for bit and on 1 rank, an unsharded checkpoint resharded, --zero 1 alone warned;
  8. FP8 delayed scaling: the replicas' amax histories made one after each step (the whole batch's amaxes, as one
     process finds them), and a 2-rank checkpoint resumed bit for bit, histories included.
Skips (exit 77) where mpirun or the MPI plugin is missing.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ANVIL, check as check_line, report, run as anvil_run, text_file, instruction_file  # noqa: E402
import mpi  # noqa: E402
from mpi import losses, mpi_env, mpirun_cmd, worst  # noqa: E402

RUN = ["--layers", "2", "--dim", "32", "--threads", "1", "--log-every", "1", "--lr", "3e-3", "--eval-examples", "0"]
MODEL = RUN + ["--heads", "2", "--seq", "16"]


def mpirun(n, args, timeout=300, env=None):
    return mpi.run(n, [ANVIL, *args], env=env, timeout=timeout)


def rank_pids(launcher_pid):
    """{rank: pid} of the anvil processes mpirun started."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK" in env and os.path.basename(ANVIL).encode() in cmd.split(b"\0")[0]:
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
    return out


def fp8_rings(run_dir):
    """Every amax a run's fp8_state.safetensors holds (each history's pending amax and its ring, core/fp8.h's
    Fp8History layout), in order."""
    import struct
    with open(os.path.join(run_dir, "fp8_state.safetensors"), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    e = json.loads(raw[8:8 + n])["fp8_amax_history"]
    vals = struct.unpack(f"<{(e['data_offsets'][1] - e['data_offsets'][0]) // 4}f",
                         raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
    F = e["shape"][-1]
    out = []
    for h in range(len(vals) // F):
        row = vals[h * F:(h + 1) * F]
        out += [row[128]] + list(row[192:192 + int(row[132])])  # kAmax, then the kLength ring slots
    return out


def wait_for_steps(out, n, proc, limit=60):
    path = os.path.join(out, "metrics.jsonl")
    t0 = time.time()
    while time.time() - t0 < limit and proc.poll() is None:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
            return True
        time.sleep(0.1)
    return False


def main():
    tmp = mpi.training_workdir(ANVIL, "anvil_dp_")
    if tmp is None:
        return 77
    failures = []

    def check(cond, msg):
        check_line(cond, msg, failures)

    data = text_file(tmp, n_words=20000)
    inst = instruction_file(tmp, n=400)
    choices = os.path.join(tmp, "choices.jsonl")  # multiple choice: 15 items, split over the ranks
    with open(choices, "w") as f:
        for i in range(15):
            f.write(json.dumps({"ctx": f"Item {i}: the", "endings": ["cat", "dog sat", "mat"][: 2 + i % 2],
                                "label": i % 2}) + "\n")

    # 1. two ranks x B == one process x 2B
    cases = [
        ("GPT-2, shuffle off", ["--data", data, "--shuffle", "off", "--heads", "2", "--seq", "16"], 2, 1),
        ("GPT-2, shuffle on, 2 x accumulation", ["--data", data, "--heads", "2", "--seq", "16"], 2, 2),
        ("Llama (GQA), shuffle on", ["--data", data, "--arch", "llama", "--heads", "4", "--kv-heads", "2", "--seq",
                                     "16"], 2, 1),
        ("instruction records (prompt tokens out of the loss)",
         ["--data", inst, "--shuffle", "off", "--heads", "2", "--seq", "48", "--eval-choices", choices], 4, 1),
    ]
    for i, (name, args, B, A) in enumerate(cases):
        tag = str(i)
        one = anvil_run(["train", *RUN, *args, "--steps", "20", "--batch", str(2 * B), "--grad-accum", str(A),
                         "--out", "one" + tag], timeout=300)
        two = mpirun(2, ["train", *RUN, *args, "--steps", "20", "--batch", str(B), "--grad-accum", str(A),
                         "--out", "two" + tag])
        if one.returncode or two.returncode:
            check(False, f"{name}: both runs succeed ({one.stderr[-400:]} {two.stderr[-600:]})")
            continue
        d, n = worst(losses("two" + tag), losses("one" + tag))
        check(n == 20 and d <= 1e-5, f"{name}: 2 ranks x batch {B} equal 1 process x batch {2 * B} over {n} steps "
              f"(worst relative loss difference {d:.2e})")
        if "--eval-choices" in args:
            s1, s2 = (json.load(open(os.path.join(r, "summary.json"))) for r in ("one" + tag, "two" + tag))
            mc = lambda s: (s.get("mc_n"), s.get("mc_acc"), s.get("mc_acc_norm"))  # noqa: E731
            check(mc(s2) == mc(s1) and s1.get("mc_n") == 15,
                  f"{name}: --eval-choices split over 2 ranks counts every item once ({mc(s2)} vs {mc(s1)})")

    # LoRA: only the adapters are reduced
    base = "one0/final"
    lora = ["--init", base, "--lora-rank", "4", "--data", data, "--shuffle", "off", "--threads", "1",
            "--log-every", "1", "--eval-examples", "0", "--lr", "3e-3", "--steps", "10"]
    one = anvil_run(["train", *lora, "--batch", "4", "--out", "lora1"], timeout=300)
    two = mpirun(2, ["train", *lora, "--batch", "2", "--out", "lora2"])
    if one.returncode or two.returncode:
        check(False, f"LoRA: both runs succeed ({one.stderr[-400:]} {two.stderr[-600:]})")
    else:
        d, n = worst(losses("lora2"), losses("lora1"))
        check(n == 10 and d <= 1e-5, f"LoRA adapters: 2 ranks equal 1 process over {n} steps ({d:.2e})")

    # 2 and 3: a 2-rank run with checkpoints; rank 0 alone writes
    args = ["train", *MODEL, "--data", data, "--steps", "20", "--batch", "2", "--save-every", "10",
            "--keep-checkpoints", "0"]
    full = mpirun(2, args + ["--out", "full"])
    check(full.returncode == 0 and "data parallel over 2 ranks (mpi)" in full.stderr,
          "a 2-rank run with checkpoints" + ("" if full.returncode == 0 else f" ({full.stderr[-400:]})"))
    files = sorted(os.listdir("full"))
    tb = [f for f in files if f.startswith("events.out.tfevents")]
    check(sorted(set(files) - set(tb)) == ["checkpoint-10", "final", "metrics.jsonl", "summary.json"] and
          len(tb) == 1, f"rank 0 alone writes the run directory ({files})")
    with open("full/metrics.jsonl") as f:
        steps = [json.loads(x)["step"] for x in f]
    check(steps == list(range(1, 21)), f"one metrics line per step, not one per rank ({len(steps)} lines)")
    with open("full/summary.json") as f:
        summary = json.load(f)
    check(summary.get("world_size") == 2 and "comm_exposed_share" in summary,
          f"the summary says 2 ranks and the exposed communication share ({summary.get('world_size')})")
    with open("full/final/trainer_state.json") as f:
        check(json.load(f).get("world_size") == 2, "the checkpoint records the world size")

    same = mpirun(2, ["train", "--resume", "full/checkpoint-10", "--out", "same"])
    if same.returncode == 0:
        a, b = losses("same"), losses("full")
        check(all(a[s] == b[s] for s in range(11, 21)), "a 2-rank checkpoint resumes on 2 ranks bit for bit")
    else:
        check(False, f"2-rank resume ({same.stderr[-400:]})")
    one = anvil_run(["train", "--resume", "full/checkpoint-10", "--out", "on1"], timeout=300)
    if one.returncode == 0:
        d, n = worst(losses("on1"), losses("full"))
        check(n == 10 and d <= 1e-5 and "resuming a 2-rank checkpoint on 1 rank: 2 x 2 accumulation" in one.stderr,
              f"a 2-rank checkpoint resumes on 1 rank with accumulation 2, saying so ({n} steps, {d:.2e})")
    else:
        check(False, f"resume on 1 rank ({one.stderr[-400:]})")

    prof = mpirun(2, ["train", *MODEL, "--data", data, "--steps", "5", "--batch", "2", "--profile", "--out", "prof"])
    rows = json.load(open("prof/profile.json")) if prof.returncode == 0 else []
    check(any(r["op"].startswith("gradient all-reduce wait") and r["calls"] == 5 for r in rows) and
          "gradient all-reduce over 2 ranks:" in prof.stderr,
          "--profile reports the communication per step the backward did not hide")

    r = anvil_run(["train", "--resume", "full/checkpoint-10", "--batch", "4", "--steps", "11", "--out", "given"],
                  timeout=300)
    check(r.returncode == 0 and "with the batch given: 4 sequences per step (the run had 4)" in r.stderr,
          "a 2-rank checkpoint resumed on 1 rank with --batch says how the step's sequences changed")

    # 4. ranks that disagree
    cmd = mpirun_cmd()
    base_args = ["train", *MODEL, "--data", data, "--steps", "3", "--batch", "2", "--out", "differ"]
    r = subprocess.run(cmd + ["-np", "1", ANVIL, *base_args, ":", "-np", "1", ANVIL, *base_args, "--seed", "7"],
                       capture_output=True, text=True, env=mpi_env(), timeout=120)
    check(r.returncode != 0 and "rank 1 was started with other options than rank 0: --seed 7 (rank 0: 1337)" in r.stderr,
          f"ranks with different flags stop at start-up naming rank 1 ({r.stderr.strip().splitlines()[:1]})")

    # 5. a stopped rank
    p = subprocess.Popen(mpirun_cmd(2) + [ANVIL, "train", *MODEL, "--data", data, "--steps", "100000", "--batch", "2",
                                          "--out", "stall", "--comm-timeout", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env())
    if wait_for_steps("stall", 3, p):
        pids = rank_pids(p.pid)
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.time()
        try:
            _, err = p.communicate(timeout=5 + 30 + 10)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        took = time.time() - t0
        if 1 in pids:
            try:
                os.kill(pids[1], signal.SIGKILL)
            except ProcessLookupError:
                pass
        check(p.returncode != 0 and took < 5 + 30 and "anvil: rank 0: error: " in err and
              "did not complete within 5 s (--comm-timeout)" in err,
              f"a stopped rank ends the job in {took:.1f} s (exit {p.returncode}), naming rank 0 and the collective "
              f"({[x for x in err.splitlines() if 'error' in x][:1]})")
    else:
        p.kill()
        check(False, f"the stall run started ({p.communicate()[1][-400:]})")

    # 6. SIGUSR1 and Ctrl-C on the launcher: a consistent checkpoint every rank agreed on, which resumes
    for sig, name in ((signal.SIGUSR1, "SIGUSR1"), (signal.SIGINT, "Ctrl-C (SIGINT)")):
        out = "stop_" + name[:4]
        # (a sparse log: once mpirun starts ending the job it stops reading the ranks' output, and a rank
        # blocked writing a full pipe could not reach its checkpoint before SIGKILL)
        quiet = [a if a != "1" or MODEL[i - 1] != "--log-every" else "50" for i, a in enumerate(MODEL)]
        p = subprocess.Popen(mpirun_cmd(2) + [ANVIL, "train", *quiet, "--data", data, "--steps", "100000",
                                              "--batch", "2", "--out", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env())
        if not wait_for_steps(out, 2, p):
            p.kill()
            check(False, f"{name}: the run started ({p.communicate()[1][-400:]})")
            continue
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        ckpts = [d for d in os.listdir(out) if d.startswith("checkpoint-")]
        ok = len(ckpts) == 1 and not os.path.exists(os.path.join(out, "anvil.lock"))
        if ok:
            step = int(ckpts[0].split("-")[1])
            r = mpirun(2, ["train", "--resume", os.path.join(out, ckpts[0]), "--steps", str(step + 2)])
            ok = r.returncode == 0 and f"resuming {out}/{ckpts[0]} at step {step}" in r.stderr
        check(ok, f"{name} on mpirun: every rank stops after one checkpoint, which resumes ({ckpts})" +
              ("" if ok else f" (exit {p.returncode}: {err[-600:]})"))

    # 7. ZeRO-1
    zargs = ["train", *MODEL, "--data", data, "--shuffle", "off", "--steps", "20", "--save-every", "10"]
    one = anvil_run([*zargs, "--batch", "4", "--out", "z_one"], timeout=300)
    two = mpirun(2, [*zargs, "--batch", "2", "--zero", "1", "--out", "z_two"])
    if one.returncode or two.returncode:
        check(False, f"ZeRO-1: both runs succeed ({one.stderr[-300:]} {two.stderr[-600:]})")
    else:
        d, n = worst(losses("z_two"), losses("z_one"))
        check(n == 20 and d <= 1e-5, f"ZeRO-1: 2 ranks x batch 2 equal 1 process x batch 4 over {n} steps ({d:.2e})")
        line = [x for x in two.stderr.splitlines() if "ZeRO-1: optimizer state" in x]
        check(len(line) == 1 and "1/2)" in line[0], f"ZeRO-1 prints each rank's share of the optimizer memory ({line})")
        check("reduce-to-owner (ZeRO-1) buckets" in two.stderr,
              "ZeRO-1 reduces each layer's gradients to their owner as the backward goes (start-up line)")
        same = mpirun(2, ["train", "--resume", "z_two/checkpoint-10", "--out", "z_same"])
        a = losses("z_same") if same.returncode == 0 else {}
        check(len(a) == 10 and all(a[s] == losses("z_two")[s] for s in a),
              "a ZeRO-1 checkpoint resumes on 2 ranks bit for bit")
        r = anvil_run(["train", "--resume", "z_two/checkpoint-10", "--out", "z_on1"], timeout=300)
        d, n = worst(losses("z_on1"), losses("z_two")) if r.returncode == 0 else (float("inf"), 0)
        check(n == 10 and d <= 1e-5 and "was sharded over 2 ranks (ZeRO-1) and is now whole: resharded" in r.stderr
              and "--zero 1 with one process: nothing to shard" in r.stderr,
              f"a ZeRO-1 checkpoint resumes on 1 rank, resharded and saying so ({n} steps, {d:.2e})")
        r = mpirun(2, ["train", "--resume", "full/checkpoint-10", "--zero", "1", "--out", "z_from_dp"])
        d, n = worst(losses("z_from_dp"), losses("full")) if r.returncode == 0 else (float("inf"), 0)
        check(n == 10 and d <= 1e-5 and "was whole and is now sharded over 2 ranks (ZeRO-1)" in r.stderr,
              f"an unsharded checkpoint resumes with --zero 1, resharded ({n} steps, {d:.2e})")

    # 8. FP8 delayed scaling: after each step the replicas' amax histories are made one (each value the largest
    # any replica holds), so each use's amax is the whole batch's, as one process with both ranks' rows finds
    # it; a 2-rank checkpoint resumes bit for bit, histories and all
    fargs = ["train", *MODEL, "--data", data, "--shuffle", "off", "--steps", "12", "--save-every", "6",
             "--grad-accum", "2", "--precision", "fp8", "--fp8-scaling", "delayed", "--fp8-history", "64"]
    one = anvil_run([*fargs, "--batch", "4", "--out", "f_one"], timeout=300)
    two = mpirun(2, [*fargs, "--batch", "2", "--out", "f_two"])
    if one.returncode or two.returncode:
        check(False, f"FP8 delayed scaling: both runs succeed ({one.stderr[-300:]} {two.stderr[-600:]})")
    else:
        d, n = worst(losses("f_two"), losses("f_one"))
        check(n == 12 and d <= 1e-5, f"FP8 delayed scaling: 2 ranks x batch 2 equal 1 process x batch 4 over {n} "
              f"steps ({d:.2e})")
        h1, h2 = fp8_rings("f_one/final"), fp8_rings("f_two/final")
        gap = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(h1, h2)) if len(h1) == len(h2) else float("inf")
        check(len(h1) > 0 and gap <= 1e-4, f"FP8 delayed scaling: the 2-rank run's amax histories are the whole "
              f"batch's, as one process's ({len(h1)} amaxes, worst relative difference {gap:.2e})")
        same = mpirun(2, ["train", "--resume", "f_two/checkpoint-6", "--out", "f_same"])
        a = losses("f_same") if same.returncode == 0 else {}
        state = [open(os.path.join(r, "final", "fp8_state.safetensors"), "rb").read() if same.returncode == 0
                 else b"" for r in ("f_two", "f_same")]
        check(len(a) == 6 and all(a[s] == losses("f_two")[s] for s in a) and state[0] == state[1] != b"",
              "FP8 delayed scaling: a 2-rank checkpoint resumes on 2 ranks bit for bit, amax histories included")

    shutil.rmtree(tmp, ignore_errors=True)
    return report(failures, "PASSED: data-parallel training under mpirun")


if __name__ == "__main__":
    sys.exit(main())
