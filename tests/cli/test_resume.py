#!/usr/bin/env python3
"""--resume continues a run so that the losses after resuming equal, bit for bit, those of a run that never
stopped.

A: one uninterrupted run of 24 steps (shuffled windows, gradient accumulation, warmup + cosine, clipping),
   checkpointing every 6 steps.
B: resumed from A's checkpoint-12 in a new process: steps 13..24 must log exactly A's losses.
C: a longer run interrupted by SIGINT part-way (it saves a checkpoint and exits 130), then resumed from its
   run directory: every step must equal those of the same run left uninterrupted.
D: --recompute only trades memory for compute: A again with --recompute full logs A's losses bit for bit, and
   A's checkpoint-12 resumed with --recompute selective, and with the option as a checkpoint written before it
   took a mode stored it (true), continue with A's losses; --logits-chunk 40K (the loss a sequence at a time)
   stays within 1e-6 of A's losses at every step, with less activation memory.
E: a --dropout run resumed from its checkpoint-12 logs the uninterrupted run's losses bit for bit (and G: an
   --augment run, and H: a --neftune-alpha run).
I: a --precision fp8 --fp8-scaling delayed run resumed from its checkpoint-12 logs the uninterrupted run's
   losses bit for bit (the amax histories travel in the checkpoint), and a resume that changes the scaling is
   refused.
F: --skip-loss-z/--skip-grad-z judge each step against the last --skip-window steps' losses and gradient
   norms; the windows travel in the checkpoint, so a run resumed at 12 logs the same z-scores, skips the same
   steps and logs the same losses as the uninterrupted one.
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
from common import ANVIL, TempDir, instruction_file, report, run  # noqa: E402

ARGS = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq", "32", "--batch", "4", "--grad-accum", "2",
        "--steps", "24", "--warmup", "4", "--lr", "3e-3", "--grad-clip", "0.5", "--log-every", "1",
        "--template", "compact", "--threads", "2", "--seed", "7"]


def losses(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in rows}


def resumed_alike(d, data, name, flags, failures):
    """Trains with `flags`, resumes from checkpoint-12 in a new process; the losses of steps 13..24 must be the
    uninterrupted run's. Returns the uninterrupted run's losses."""
    x, x2 = os.path.join(d, name), os.path.join(d, name + "2")
    run(["train", "--data", data, "--out", x, "--save-every", "6", *flags, *ARGS], check=True)
    run(["train", "--resume", os.path.join(x, "checkpoint-12"), "--out", x2], check=True)
    lx, lx2 = losses(x), losses(x2)
    diff = [s for s in range(13, 25) if lx2.get(s) != lx[s]]
    print(f"{' '.join(flags)} resumed at 12: {len(diff)} of 12 steps differ from the uninterrupted run")
    if diff:
        failures.append(f"{' '.join(flags)}: the resumed run differs at steps {diff}")
    return lx


def main():
    failures = []
    with TempDir() as d:
        data = instruction_file(d)
        a, b, c = (os.path.join(d, n) for n in ("a", "b", "c"))
        ra = run(["train", "--data", data, "--out", a, "--save-every", "6", "--keep-checkpoints", "0", *ARGS],
                 check=True)
        la = losses(a)
        assert sorted(la) == list(range(1, 25)), sorted(la)

        run(["train", "--resume", os.path.join(a, "checkpoint-12"), "--out", b], check=True)
        lb = losses(b)
        if sorted(lb) != list(range(13, 25)):
            failures.append(f"B logged steps {sorted(lb)}, expected 13..24")
        diff = [s for s in lb if lb[s] != la.get(s)]
        print(f"B (resumed at 12): {len(lb)} steps, {len(diff)} differ from A")
        if diff:
            failures.append(f"B differs from A at steps {diff}: {[(lb[s], la[s]) for s in diff]}")

        # C: interrupt with SIGINT after a few steps have been logged, then resume the run directory.
        slow = [x if x != "24" else "400" for x in ARGS]  # long enough to be caught mid-run
        p = subprocess.Popen([ANVIL, "train", "--data", data, "--out", c, *slow], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        metrics = os.path.join(c, "metrics.jsonl")
        while time.time() < deadline:
            if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 5:
                break
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        if p.returncode != 130:
            failures.append(f"interrupted run exited {p.returncode}, expected 130\n{err[-500:]}")
        stopped = max(losses(c))
        print(f"C interrupted after step {stopped}: {err.strip().splitlines()[-1]}")
        ref = os.path.join(d, "ref")
        run(["train", "--data", data, "--out", ref, *slow], check=True)
        run(["train", "--resume", c], check=True)
        lc, lref = losses(c), losses(ref)
        diff = [s for s in lref if lc.get(s) != lref[s]]
        print(f"C resumed to the end: {len(diff)} of {len(lref)} steps differ from an uninterrupted run")
        if diff:
            failures.append(f"C differs at steps {diff[:10]}")

        # D: recomputation changes nothing but memory
        full = os.path.join(d, "full")
        run(["train", "--data", data, "--out", full, "--recompute", "full", *ARGS], check=True)
        lf = losses(full)
        diff = [s for s in la if lf.get(s) != la[s]]
        print(f"D --recompute full: {len(diff)} of {len(la)} steps differ from A")
        if diff:
            failures.append(f"--recompute full differs from A at steps {diff[:10]}")
        chunk = os.path.join(d, "chunk")
        r = run(["train", "--data", data, "--out", chunk, "--logits-chunk", "40K", *ARGS], check=True)
        lc = losses(chunk)
        worst = max(abs(lc[s] - la[s]) / la[s] for s in la)
        mem = [float(re.search(r"activations ([0-9.]+) MB", x.stderr).group(1)) for x in (r, ra)]
        print(f"D --logits-chunk 40K: worst relative loss difference {worst:.1e}; activations {mem[0]} MB, "
              f"{mem[1]} MB whole")
        if not (sorted(lc) == sorted(la) and worst <= 1e-6 and mem[0] < mem[1]):
            failures.append(f"--logits-chunk 40K: losses within {worst:.1e} of A, activations {mem}")
        old = os.path.join(d, "old-checkpoint")
        shutil.copytree(os.path.join(a, "checkpoint-12"), old)
        state_path = os.path.join(old, "trainer_state.json")
        state = json.load(open(state_path))
        state["options"]["recompute"] = True  # as written before --recompute took a mode
        json.dump(state, open(state_path, "w"))
        for name, args in (("sel", ["--resume", os.path.join(a, "checkpoint-12"), "--recompute", "selective"]),
                           ("old", ["--resume", old])):
            out = os.path.join(d, name)
            run(["train", *args, "--out", out], check=True)
            lr = losses(out)
            diff = [s for s in range(13, 25) if lr.get(s) != la[s]]
            print(f"D resumed at 12 ({name}): {len(diff)} of 12 steps differ from A")
            if diff:
                failures.append(f"resume {name} differs from A at steps {diff}")
            saved = json.load(open(os.path.join(out, "final", "trainer_state.json")))["options"]["recompute"]
            if saved != "selective":
                failures.append(f"resume {name} stored --recompute {saved!r}, expected 'selective'")

        # the backend's choices that change the numbers are the run's: summary.json and trainer_state.json keep
        # them, and a resume that would change one is refused (one that changes only the speed is not)
        backend = json.load(open(os.path.join(a, "summary.json"))).get("backend", {})
        stored = json.load(open(os.path.join(a, "checkpoint-12", "trainer_state.json")))["options"]
        print(f"D backend choices: summary {backend}")
        if backend.get("gemm_tune") is not False or backend.get("attention") != "auto" or \
                stored.get("gemm_tune") is not False or stored.get("attn_fwd_rows") != 64:
            failures.append(f"the backend's choices not recorded: summary {backend}, state {stored}")
        for flag, value in (("--gemm-tune", "on"), ("--attention", "gemm")):
            r = run(["train", "--resume", os.path.join(a, "checkpoint-12"), flag, value,
                     "--out", os.path.join(d, "refused")])
            if r.returncode == 0 or f"{flag} {value}: the run being resumed used" not in r.stderr:
                failures.append(f"--resume with {flag} {value}: exit {r.returncode}, {r.stderr[-300:]}")
        # E: --dropout draws its masks from (seed, step, micro-batch), so a resumed run draws the same ones
        le = resumed_alike(d, data, "e", ["--dropout", "0.2"], failures)
        if le[1] == la[1]:
            failures.append(f"--dropout 0.2 logged step 1's loss without dropout ({la[1]})")
        # F: the outlier windows are part of the training state
        f, f2 = os.path.join(d, "f"), os.path.join(d, "f2")
        skip = ["--skip-loss-z", "1", "--skip-grad-z", "1", "--skip-window", "4"]
        run(["train", "--data", data, "--out", f, "--save-every", "6", *skip, *ARGS], check=True)
        run(["train", "--resume", os.path.join(f, "checkpoint-12"), "--out", f2], check=True)

        def judged(run_dir):
            rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
            return {r["step"]: (r["loss"], r.get("loss_z"), r.get("grad_z"), r.get("skipped_for")) for r in rows}

        jf, jf2 = judged(f), judged(f2)
        skipped = sorted(s for s in jf if jf[s][3])
        diff = [s for s in range(13, 25) if jf2.get(s) != jf[s]]
        print(f"F --skip-loss-z 1 --skip-grad-z 1 --skip-window 4: steps {skipped} skipped; resumed at 12, "
              f"{len(diff)} of 12 steps differ (loss, z-scores, skip)")
        if diff:
            failures.append(f"outlier skipping: the resumed run differs at steps {diff}: "
                            f"{[(jf2.get(s), jf[s]) for s in diff]}")
        if not [s for s in skipped if s > 12] or jf[13][1] is None:
            failures.append(f"outlier skipping: no skipped step after 12 ({skipped}) or no z-score at step 13: "
                            "the scenario shows nothing")
        # G: --augment draws each record's copy from (seed, epoch, record): the resumed run sees the same rows
        lg = resumed_alike(d, data, "g", ["--augment", "swap,insert,case,space", "--augment-prob", "0.9",
                                          "--augment-p", "0.5"], failures)
        if lg[1] == la[1]:
            failures.append(f"--augment logged step 1's loss without augmentation ({la[1]})")
        # H: --neftune-alpha draws its noise from the pass's seed: the resumed run adds the same noise
        lh = resumed_alike(d, data, "h", ["--neftune-alpha", "5"], failures)
        if lh[1] == la[1]:
            failures.append(f"--neftune-alpha 5 logged step 1's loss without noise ({la[1]})")
        # I: FP8 delayed scaling's amax histories travel in the checkpoint (fp8_state.safetensors), so a run
        # resumed at 12 scales its products as the uninterrupted one did and ends with the same histories, bit
        # for bit (without them it would scale the first resumed uses from their own amaxes, and its rings
        # would hold 24 uses where the uninterrupted one's hold 16 of 48). (Power-of-two scales change a
        # rounding only at the format's ends, saturation and subnormals, so the losses alone would rarely tell.)
        delayed = ["--precision", "fp8", "--fp8-scaling", "delayed", "--fp8-history", "16"]
        li = resumed_alike(d, data, "i", delayed, failures)
        states = [os.path.join(d, n, "final", "fp8_state.safetensors") for n in ("i", "i2")]
        if not os.path.exists(os.path.join(d, "i", "checkpoint-12", "fp8_state.safetensors")) or \
                not all(os.path.exists(p) for p in states):
            failures.append("--fp8-scaling delayed: a checkpoint keeps no fp8_state.safetensors")
        elif open(states[0], "rb").read() != open(states[1], "rb").read():
            failures.append("--fp8-scaling delayed: the resumed run ends with other amax histories than the "
                            "uninterrupted one")
        cur = os.path.join(d, "cur")
        run(["train", "--data", data, "--out", cur, "--precision", "fp8", *ARGS], check=True)
        lcur = losses(cur)
        if lcur == li:
            failures.append("--fp8-scaling delayed logged current scaling's losses: it scaled nothing otherwise")
        r = run(["train", "--resume", os.path.join(d, "i", "checkpoint-12"), "--fp8-scaling", "current",
                 "--out", os.path.join(d, "refused-fp8")])
        if r.returncode == 0 or "--fp8-scaling current: the run being resumed used" not in r.stderr:
            failures.append(f"--resume with --fp8-scaling current: exit {r.returncode}, {r.stderr[-300:]}")
        z = os.path.join(d, "z")
        run(["train", "--data", data, "--out", z, "--neftune-alpha", "0", *ARGS], check=True)
        if losses(z) != la:
            failures.append("--neftune-alpha 0 is not the run without it, bit for bit")
    return report(failures, "PASSED: resumed runs reproduce the uninterrupted losses bit for bit")


if __name__ == "__main__":
    sys.exit(main())
