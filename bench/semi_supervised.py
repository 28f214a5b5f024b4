"""Semi-supervised gain from pseudo-labels (issue 47's first must-show), end to end on a checkable task.

A base model learns the embedded default's skills (reverse, sort the letters, uppercase, on random words; the
demo's settings). A new skill, "Sort descending.", comes with L labelled records, U unlabelled inputs and H
held-out records. The teacher is the base fine-tuned on the L labelled ones. `anvil data pseudo-label`
answers the U unlabelled inputs three ways:
  greedy      one greedy answer a record, nothing dropped (classic pseudo-labelling)
  vote        --num-samples 5 at temperature 0.7, kept where 3 of the 5 agree (self-consistency)
  verified    the same samples, kept where a checker program accepts the answer (rejection sampling, RFT)
Each label set's accuracy is measured against the rule. Students are the base fine-tuned on the labelled
records plus each set (`anvil sweep` over --data; the teacher's flags and steps); every model answers the H
held-out records (`anvil eval --per-example`), and `anvil compare` gives each student's difference from the
teacher with a paired-bootstrap 95% interval.

    python3 bench/semi_supervised.py [--anvil build/anvil] [--work DIR] [--out bench/results/FILE.json]
                                     [--labelled 300 --unlabelled 5000 --heldout 500 --steps 300]
"""
import glob
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_bench_common import parse_args, report, step, write_jsonl  # noqa: E402

CHECKER = r'''import json, sys
r = json.loads(sys.stdin.readline())
sys.exit(0 if r["output"] == "".join(sorted(r["input"], reverse=True)) else 1)
'''


def words(rnd, n, seen):
    out = []
    while len(out) < n:
        w = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 7)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def base_skills(n, rnd):
    """The embedded default's skills (src/data/synthetic.h), interleaved."""
    skills = [("Reverse.", lambda w: w[::-1]), ("Sort.", lambda w: "".join(sorted(w))),
              ("Uppercase.", lambda w: w.upper())]
    return [{"instruction": skills[i % 3][0], "input": w, "output": skills[i % 3][1](w)}
            for i, w in enumerate(words(rnd, n, set()))]


def new_skill(w):
    return {"instruction": "Sort descending.", "input": w, "output": "".join(sorted(w, reverse=True))}


def correct(rec):
    return rec.get("output") == new_skill(rec["input"])["output"]




def main():
    a, A, W = parse_args("/tmp/anvil-semi", labelled=300, unlabelled=5000, heldout=500, steps=300, base_steps=1000)
    t0 = time.time()
    demo = ["--seq", "64", "--batch", "32", "--weight-decay", "0.1", "--grad-clip", "1", "--threads", a.threads,
            "--template", "compact"]  # the embedded default's settings (train/options.cpp)
    L, U, H = a.labelled, a.unlabelled, a.heldout
    rnd = random.Random(1)
    base_data = os.path.join(W, "base.jsonl")
    write_jsonl(base_data, base_skills(12000, rnd))
    base = os.path.join(W, "base")
    if not os.path.exists(os.path.join(base, "final")):
        step([A, "train", "--data", base_data, "--out", base, "--steps", str(a.base_steps), "--lr", "2e-3",
            "--warmup", "50", "--val-fraction", "0.02", "--eval-examples", "100", *demo], "(the base model)")
    recs = [new_skill(w) for w in words(rnd, L + U + H, set())]
    labelled, unlabelled, heldout = recs[:L], recs[L:L + U], recs[L + U:]
    train_flags = ["--init", os.path.join(base, "final"), "--steps", str(a.steps), "--lr", "1e-3", "--val-fraction",
                   "0", "--eval-examples", "0", *demo]
    paths = {k: os.path.join(W, k + ".jsonl") for k in ("labelled", "unlabelled", "heldout")}
    write_jsonl(paths["labelled"], labelled)
    write_jsonl(paths["unlabelled"], [{"instruction": r["instruction"], "input": r["input"]} for r in unlabelled])
    write_jsonl(paths["heldout"], heldout)
    checker = os.path.join(W, "checker.py")
    open(checker, "w").write(CHECKER)

    teacher = os.path.join(W, "teacher")
    if not os.path.exists(os.path.join(teacher, "final")):
        step([A, "train", "--data", paths["labelled"], "--out", teacher, *train_flags], "(the teacher)")
    label_sets = {
        "greedy": ["--num-samples", "1", "--temperature", "0"],
        "vote": ["--num-samples", "5", "--temperature", "0.7", "--min-agreement", "0.6"],
        "verified": ["--num-samples", "5", "--temperature", "0.7", "--verify", f"cmd:python3 {checker}"],
    }
    labels = {}
    for name, flags in label_sets.items():
        out = os.path.join(W, f"pseudo_{name}.jsonl")
        summary = out + ".summary"
        if not os.path.exists(summary):  # (a rerun reuses what an earlier one labelled)
            r = step([A, "data", "pseudo-label", "--model", os.path.join(teacher, "final"), "--in",
                    paths["unlabelled"], "--out", out, "--seed", "1", "--threads", a.threads, *flags], f"({name})")
            open(summary, "w").write(r.stdout.strip())
        kept = [json.loads(x) for x in open(out)]
        labels[name] = {"kept": len(kept), "of": U, "accuracy": sum(map(correct, kept)) / len(kept),
                        "summary": open(summary).read()}
        mixed = os.path.join(W, f"student_{name}.jsonl")
        write_jsonl(mixed, labelled + [{k: v for k, v in x.items() if k != "pseudo_label"} for x in kept])
        labels[name]["data"] = mixed
        print(f"           {name}: {len(kept)} of {U} kept, {labels[name]['accuracy']:.3f} correct", flush=True)

    sweep = os.path.join(W, "sweep")
    names = list(label_sets)
    step([A, "sweep", "--grid", "data=" + ",".join(labels[n]["data"] for n in names), "--out", sweep, "--",
        *train_flags], "(the students)")
    models = {"teacher": os.path.join(teacher, "final")}
    for i, n in enumerate(names):
        run_dir = [p for p in glob.glob(os.path.join(sweep, f"run-{i:03d}-*")) if os.path.isdir(p)][0]
        models["student_" + n] = os.path.join(run_dir, "final")
    per = {}
    for m, d in models.items():
        per[m] = os.path.join(W, f"eval_{m}.jsonl")
        step([A, "eval", "--model", d, "--data", paths["heldout"], "--max-examples", str(H), "--per-example", per[m],
            "--threads", a.threads], f"({m} on the held-out records)")
    rows = []
    for m in models:
        ex = [json.loads(x) for x in open(per[m])]
        row = {"model": m, "exact_match": sum(e["exact"] for e in ex) / len(ex), "n": len(ex)}
        if m != "teacher":
            c = json.loads(step([A, "compare", per["teacher"], per[m], "--bootstrap", "2000", "--seed", "1",
                               "--json"]).stdout)
            row["vs_teacher"] = c
            n = m[len("student_"):]
            row.update(labels=n, pseudo_kept=labels[n]["kept"], pseudo_accuracy=labels[n]["accuracy"])
        rows.append(row)
    result = {"command": " ".join(sys.argv), "labelled": L, "unlabelled": U, "heldout": H, "steps": a.steps,
              "labels": labels, "models": rows, "wall_s": round(time.time() - t0, 1)}
    report(result, a.out)


if __name__ == "__main__":
    main()
