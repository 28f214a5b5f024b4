#!/usr/bin/env python3
"""--keep-best and --early-stop: the run keeps the checkpoint of its lowest validation loss and stops once the
validation loss has not improved for N evaluations in a row, and a resumed run goes on from both.

A: a small model overfits 60 records (validation loss falls, then rises) for 200 steps, evaluating every 10:
   OUT/best is a resumable checkpoint at the step of the lowest validation loss in metrics.jsonl, and
   summary.json names it.
B: the same with --early-stop 3 and --save-every 10: it stops at the first evaluation that is the third in a
   row without improvement, as A's curve says, with A's losses bit for bit up to there.
C: B resumed in another directory from its checkpoint one evaluation past the best (so the best and the count
   since it both come from the checkpoint) stops at the same step and names B's best.
D: --keep-best off writes no best directory and names none (but OUT/final, when the last evaluation is the best).
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import TempDir, check, report, run  # noqa: E402

ARGS = ["--layers", "2", "--heads", "2", "--dim", "64", "--seq", "32", "--batch", "8", "--steps", "200", "--lr",
        "1e-2", "--eval-every", "10", "--val-fraction", "0.3", "--log-every", "10", "--template", "compact",
        "--threads", "2", "--seed", "7", "--tensorboard", "off"]


def records(path):
    rng = random.Random(3)
    with open(path, "w") as f:
        for _ in range(60):
            w = "".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(4, 9)))
            f.write(json.dumps({"instruction": "Reverse.", "input": w, "output": w[::-1]}) + "\n")
    return path


def metrics(out):
    return [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]


def main():
    failures = []
    with TempDir() as d:
        data = records(os.path.join(d, "d.jsonl"))
        a = os.path.join(d, "a")
        ra = run(["train", "--data", data, "--out", a, *ARGS], check=True)
        evals = [(r["step"], r["val_loss"]) for r in metrics(a) if "val_loss" in r]
        best_step, best_loss = min(evals, key=lambda e: (e[1], e[0]))
        # each evaluation printed as it happens, the new lows marked
        printed = [l for l in ra.stderr.splitlines() if l.startswith("eval at step ")]
        low, want = None, []
        for step, loss in evals:
            if step == 200:
                continue  # the end-of-run evaluation has its own lines
            new_low = low is None or loss < low
            low = loss if new_low else low
            want.append((f"eval at step {step}: val loss {loss:.4f}", new_low))
        check(len(printed) == len(want) and
              all(l.startswith(w) and ("best so far: saved best/" in l) == n for l, (w, n) in zip(printed, want)),
              f"every evaluation printed with its loss and whether it is the best ({len(printed)} lines)", failures)
        summary = json.load(open(os.path.join(a, "summary.json")))
        state = json.load(open(os.path.join(a, "best", "trainer_state.json")))
        print(f"A: {len(evals)} evaluations, the lowest {best_loss:.4f} at step {best_step}, the last "
              f"{evals[-1][1]:.4f}")
        check(evals[-1][1] > best_loss, "A overfits: its last validation loss is above its lowest", failures)
        check(state["step"] == best_step and state["best"]["val_loss"] == best_loss,
              f"OUT/best holds step {state['step']}, the lowest validation loss's", failures)
        check(summary.get("best_step") == best_step and summary.get("best_val_loss") == best_loss and
              summary.get("best_model_dir") == os.path.abspath(os.path.join(a, "best")),
              f"summary.json names the best: {summary.get('best_step')}, {summary.get('best_model_dir')}", failures)
        r = run(["eval", "--model", os.path.join(a, "best"), "--data", data, "--json"])
        check(r.returncode == 0 and json.loads(r.stdout).get("targets", 0) > 0, "anvil eval loads OUT/best",
              failures)

        # B: the step where the third evaluation in a row fails to improve on the best, from A's curve
        expect, low, since = None, None, 0
        for step, loss in evals:
            if low is None or loss < low:
                low, since = loss, 0
            else:
                since += 1
                if since == 3:
                    expect = step
                    break
        assert expect is not None and expect < 200, "the data no longer overfits within 200 steps"
        b = os.path.join(d, "b")
        rb = run(["train", "--data", data, "--out", b, "--early-stop", "3", "--save-every", "10",
                  "--keep-checkpoints", "0", *ARGS], check=True)
        sb = json.load(open(os.path.join(b, "summary.json")))
        la = {r["step"]: r["loss"] for r in metrics(a)}
        lb = {r["step"]: r["loss"] for r in metrics(b)}
        print(f"B: stopped at step {sb['steps']} (expected {expect}); {rb.stderr.strip().splitlines()[-1][:120]}")
        check(sb["steps"] == expect and sb.get("early_stopped") is True and max(lb) == expect and
              f"early stop at step {expect}:" in rb.stderr,
              f"--early-stop 3 stops at step {expect}", failures)
        check(all(lb[s] == la[s] for s in lb), "B's losses are A's, bit for bit, up to the stop", failures)
        check(sb.get("best_step") == best_step and os.path.isdir(os.path.join(b, "final")),
              "B names the same best and saves its final model", failures)

        # (which evaluation is the lowest depends on the machine's BLAS kernels and on anvil's GELU to the last
        # bits: the checkpoint follows it rather than a fixed step)
        c, at = os.path.join(d, "c"), best_step + 10
        run(["train", "--resume", os.path.join(b, f"checkpoint-{at}"), "--out", c], check=True)
        sc = json.load(open(os.path.join(c, "summary.json")))
        print(f"C: resumed at {at}, stopped at {sc['steps']}, best {sc.get('best_step')} in "
              f"{sc.get('best_model_dir')}")
        check(sc["steps"] == expect and sc.get("best_step") == best_step and
              sc.get("best_model_dir") == os.path.abspath(os.path.join(b, "best")),
              "a resumed run keeps the best and the count since it", failures)

        e = os.path.join(d, "e")
        run(["train", "--data", data, "--out", e, "--keep-best", "off", *ARGS[:ARGS.index("--steps")],
             "--steps", "60", *ARGS[ARGS.index("--steps") + 2:]], check=True)
        se = json.load(open(os.path.join(e, "summary.json")))
        # (where the last evaluation is the lowest, the summary names OUT/final, which exists either way: how
        # close 50's and 60's losses are depends on the machine's BLAS kernels)
        check(not os.path.exists(os.path.join(e, "best")) and
              se.get("best_model_dir") in (None, os.path.join(e, "final")) and "best_step" in se,
              "--keep-best off: no OUT/best, the best still reported", failures)
    return report(failures, "PASSED: --keep-best keeps the lowest validation loss, --early-stop stops after it")


if __name__ == "__main__":
    sys.exit(main())
