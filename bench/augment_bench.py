"""Augmentation against reworded instructions (issue 47's augmentation must-show), end to end.

Six tasks on a word, each asked by one fixed instruction in training: with `--tasks lookup` (the default) its
first, second, third, next-to-last or last letter, or its length, one-character answers fixed once the task is
understood; with `--tasks skills` reverse it, capitalise it, repeat it, its first or last letter, its letters
sorted, three of which take the model most of its training to learn. The word is the record's input, so
rewording the instruction never changes the answer. Two held-out sets of new words: the training phrasings,
and the same tasks reworded in ways the training set never shows (synonyms from a word list, a word dropped,
the case changed, spaces doubled, a filler word). Two models of the same size and steps (`--arch gpt2` or
`llama`): one on the records as they are, one with `anvil train --augment
swap,delete,insert,synonym,case,space --synonyms LIST` (a fresh draw each epoch). `anvil compare` gives each
held-out set's exact-match difference with its paired-bootstrap interval, and the result each task's counts.
Runs whose `final` directory exists in `--work` are reused.

    python3 bench/augment_bench.py [--anvil build/anvil] [--work DIR] [--out bench/results/FILE.json]
                                   [--train 1200 --heldout 300 --steps 1000 --seeds 1 --augment-prob 0.5]
                                   [--tasks lookup|skills --seq 64 --batch 32 --arch gpt2|llama]
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_bench_common import parse_args, report, step, write_jsonl  # noqa: E402

# "lookup": tasks whose answer is fixed once the task is known, so exact match measures whether the model
# understood the instruction; "skills": tasks that also need the most training to do (reverse, repeat, sort)
TASK_SETS = {
    "lookup": {
        "Give the first letter.": lambda w: w[0],
        "Give the second letter.": lambda w: w[1],
        "Give the third letter.": lambda w: w[2],
        "Give the penultimate letter.": lambda w: w[-2],
        "Give the last letter.": lambda w: w[-1],
        "Count the letters.": lambda w: str(len(w)),
    },
    "skills": {
        "Reverse the letters of the word.": lambda w: w[::-1],
        "Write the word in capital letters.": lambda w: w.upper(),
        "Repeat the word twice.": lambda w: w + w,
        "Give the first letter of the word.": lambda w: w[0],
        "Give the last letter of the word.": lambda w: w[-1],
        "Sort the letters of the word.": lambda w: "".join(sorted(w)),
    },
}
# the word list --augment draws from, and the held-out rewording too (as EDA uses WordNet's)
SYNONYMS = [["reverse", "flip", "invert"], ["letters", "characters"], ["word", "term"],
            ["write", "put", "spell"], ["capital", "upper-case", "block"], ["repeat", "duplicate"],
            ["twice", "two times"], ["give", "tell", "name"], ["first", "initial", "opening"],
            ["last", "final", "closing"], ["sort", "order", "arrange"], ["second", "2nd"], ["third", "3rd"],
            ["penultimate", "next-to-last", "second-to-last"], ["count", "tally"]]
FILLERS = ["please", "now", "kindly", "quickly"]


def reworded(instr, rnd):
    """Two or three rewordings of one instruction: a synonym always, then two of drop, case, spaces, filler."""
    table = {w: g for g in SYNONYMS for w in g}
    words = instr.rstrip(".").split()
    have = [i for i, w in enumerate(words) if w.lower() in table]
    i = rnd.choice(have)
    alt = rnd.choice([s for s in table[words[i].lower()] if s != words[i].lower()])
    words[i] = alt.capitalize() if words[i][0].isupper() else alt
    for how in rnd.sample(["drop", "case", "space", "filler"], 2):
        if how == "drop" and len(words) > 3:
            del words[rnd.choice([k for k, w in enumerate(words) if w.lower() in ("the", "of", "in")] or [1])]
        elif how == "case":
            words = [w.lower() for w in words] if rnd.random() < 0.5 else [w.upper() for w in words]
        elif how == "space":
            k = rnd.randrange(1, len(words))
            words[k] = " " + words[k]
        elif how == "filler":
            words.insert(rnd.choice([0, len(words)]), rnd.choice(FILLERS))
    return " ".join(words) + "."


def main():
    a, A, W = parse_args("/tmp/anvil-augment", train=1200, heldout=300, steps=1000, seeds=1, augment_prob=0.5,
                         tasks="lookup", seq=64, batch=32, arch="gpt2")
    if a.tasks not in TASK_SETS:
        sys.exit(f"--tasks {a.tasks}: use {' or '.join(TASK_SETS)}")
    tasks = TASK_SETS[a.tasks]
    t0 = time.time()
    rnd = random.Random(1)
    seen = set()

    def record(instr=None):
        while True:
            w = "".join(rnd.choice("abcdefgh") for _ in range(rnd.randint(3, 6)))
            if w not in seen:
                seen.add(w)
                break
        instr = instr or rnd.choice(sorted(tasks))
        return {"instruction": instr, "input": w, "output": tasks[instr](w)}

    train = [record() for _ in range(a.train)]
    held = [record() for _ in range(a.heldout)]
    new = [dict(r, instruction=reworded(r["instruction"], rnd)) for r in held]
    assert not {r["instruction"] for r in new} & set(tasks)
    paths = {k: os.path.join(W, k + ".jsonl") for k in ("train", "heldout", "reworded")}
    write_jsonl(paths["train"], train)
    write_jsonl(paths["heldout"], held)
    write_jsonl(paths["reworded"], new)
    syn = os.path.join(W, "synonyms.txt")
    with open(syn, "w") as f:
        f.writelines(", ".join(g) + "\n" for g in SYNONYMS)
    flags = ["--data", paths["train"], "--steps", str(a.steps), "--threads", a.threads, "--val-fraction", "0",
             "--eval-examples", "0", "--arch", a.arch, "--layers", "4", "--dim", "128", "--heads", "4",
             "--seq", str(a.seq), "--batch", str(a.batch), "--lr", "2e-3", "--warmup", "50", "--template", "compact"]
    aug = ["--augment", "swap,delete,insert,synonym,case,space", "--synonyms", syn,
           "--augment-prob", str(a.augment_prob), "--augment-p", "0.2"]
    runs = {}
    for seed in range(1, a.seeds + 1):
        for name, extra in (("plain", []), ("augment", aug)):
            run_dir = os.path.join(W, f"run_{name}_{seed}")
            if not os.path.exists(os.path.join(run_dir, "final")):
                step([A, "train", "--out", run_dir, "--seed", str(seed), *flags, *extra],
                     f"anvil train ({name}, seed {seed})")
            for held_name in ("heldout", "reworded"):
                per = os.path.join(W, f"eval_{name}_{seed}_{held_name}.jsonl")
                step([A, "eval", "--model", os.path.join(run_dir, "final"), "--data", paths[held_name],
                      "--max-examples", str(a.heldout), "--per-example", per, "--threads", a.threads],
                     f"exact match on {held_name} ({name}, seed {seed})")
                runs[(name, seed, held_name)] = per
    result = {"command": " ".join(sys.argv), "tasks": a.tasks, "arch": a.arch, "seq": a.seq, "batch": a.batch,
              "train": a.train, "heldout": a.heldout, "steps": a.steps,
              "augment_flags": " ".join(aug).replace(syn, "synonyms.txt"), "synonyms": SYNONYMS,
              "reworded_examples": [r["instruction"] for r in new[:8]], "seeds": {}}
    for seed in range(1, a.seeds + 1):
        res = {}
        for held_name in ("heldout", "reworded"):
            p, q = runs[("plain", seed, held_name)], runs[("augment", seed, held_name)]
            em, by_task = {}, {}
            for n, f in (("plain", p), ("augment", q)):
                exact = [json.loads(x)["exact"] for x in open(f)]
                em[n] = sum(exact) / a.heldout
                for r, ok in zip(held, exact):  # the reworded set's records are the held-out ones, in order
                    by_task.setdefault(r["instruction"], {}).setdefault(n, [0, 0])
                    by_task[r["instruction"]][n][0] += ok
                    by_task[r["instruction"]][n][1] += 1
            cmp = json.loads(step([A, "compare", p, q, "--bootstrap", "2000", "--seed", "1", "--json"],
                                  f"anvil compare ({held_name}, seed {seed})").stdout)
            counts = {t: {n: f"{k}/{m}" for n, (k, m) in v.items()} for t, v in by_task.items()}
            res[held_name] = {"exact_match": em, "augment_minus_plain": cmp, "by_task": counts}
        result["seeds"][str(seed)] = res
    result["wall_s"] = round(time.time() - t0, 1)
    report(result, a.out)


if __name__ == "__main__":
    main()
