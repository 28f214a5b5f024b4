"""Train/test leakage through reworded copies (issue 47's MinHash must-show), end to end.

A memorisation task: each record asks for the colour of a phrase of 20 random words, the colour one of 8 at
random, so nothing but memory answers a held-out record (chance: 1/8). Each of H held-out records is reworded
three times (one word of the phrase changed; web data repeats) and the copies planted among N training
records. A model trained on that set
answers the held-out records far above chance: the held-out score is inflated. `anvil data dedup --against
held-out` finds the copies (word 3-gram MinHash at Jaccard 0.5: one word in 20 changed leaves 15 of 21
distinct shingles shared, 0.71); trained on what it keeps, the same model scores at chance. `anvil compare`
gives the difference with its paired-bootstrap interval.

    python3 bench/leakage_bench.py [--anvil build/anvil] [--work DIR] [--out bench/results/FILE.json]
                                   [--train 1000 --heldout 200 --copies 3 --steps 800]
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_bench_common import parse_args, report, step, write_jsonl  # noqa: E402

COLOURS = ["red", "blue", "green", "amber", "violet", "grey", "white", "black"]


def main():
    a, A, W = parse_args("/tmp/anvil-leakage", train=1000, heldout=200, steps=800, copies=3)
    t0 = time.time()
    rnd = random.Random(1)
    vocab = [f"w{i}" for i in range(400)]

    def record():
        return {"instruction": "Colour?", "input": " ".join(rnd.choice(vocab) for _ in range(20)),
                "output": rnd.choice(COLOURS)}

    held = [record() for _ in range(a.heldout)]
    train = [record() for _ in range(a.train)]
    copies = []
    for r in held:
        for _ in range(a.copies):
            words = r["input"].split()
            words[rnd.randrange(len(words))] = rnd.choice(vocab)
            copies.append(dict(r, input=" ".join(words)))
    leaky = train + copies
    rnd.shuffle(leaky)
    paths = {k: os.path.join(W, k + ".jsonl") for k in ("heldout", "leaky", "clean")}
    write_jsonl(paths["heldout"], held)
    write_jsonl(paths["leaky"], leaky)
    rep = os.path.join(W, "dropped.jsonl")
    r = step([A, "data", "dedup", "--in", paths["leaky"], "--out", paths["clean"], "--against", paths["heldout"],
            "--ngram", "3", "--threshold", "0.5", "--report", rep], "anvil data dedup --against")
    dropped = [json.loads(x) for x in open(rep)]
    planted = {c["input"] for c in copies}
    lines = open(paths["leaky"]).read().splitlines()
    caught = sum(json.loads(lines[d["line"] - 1])["input"] in planted for d in dropped)
    flags = ["--steps", str(a.steps), "--threads", a.threads, "--val-fraction", "0", "--eval-examples", "0",
             "--seq", "128", "--batch", "32", "--lr", "2e-3", "--warmup", "50", "--template", "compact"]
    per = {}
    for name in ("leaky", "clean"):
        run_dir = os.path.join(W, "run_" + name)
        if not os.path.exists(os.path.join(run_dir, "final")):
            step([A, "train", "--data", paths[name], "--out", run_dir, *flags], f"anvil train on the {name} set")
        per[name] = os.path.join(W, f"eval_{name}.jsonl")
        step([A, "eval", "--model", os.path.join(run_dir, "final"), "--data", paths["heldout"], "--max-examples",
            str(a.heldout), "--per-example", per[name], "--threads", a.threads], f"held-out exact match ({name})")
    score = {n: sum(json.loads(x)["exact"] for x in open(p)) / a.heldout for n, p in per.items()}
    cmp = json.loads(step([A, "compare", per["leaky"], per["clean"], "--bootstrap", "2000", "--seed", "1",
                         "--json"], "anvil compare").stdout)
    result = {"command": " ".join(sys.argv), "train": a.train, "heldout": a.heldout, "steps": a.steps,
              "planted_copies": len(copies), "dedup_dropped": len(dropped), "dedup_caught_planted": caught,
              "training_records": {"leaky": len(leaky), "clean": len(leaky) - len(dropped)},
              "dedup_summary": r.stdout.strip(), "exact_match": score, "chance": 1 / len(COLOURS),
              "clean_minus_leaky": cmp, "wall_s": round(time.time() - t0, 1)}
    report(result, a.out)


if __name__ == "__main__":
    main()
