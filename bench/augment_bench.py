"""Augmentation against reworded instructions (issue 47's augmentation must-show), end to end.

Tasks on a word, each asked by one fixed instruction in training. `--tasks letters` (the default): the first,
second, third, next-to-last or last letter of a five-letter word, one-character answers at a fixed distance
from the answer whatever the instruction's length, so that once the letter-reading skill is learned exact match
asks only whether the instruction was understood. `--tasks lookup`: the same and the word's length, on words
of 3 to 6 letters. `--tasks skills`: reverse it, capitalise it, repeat it, its first or last letter, its
letters sorted. The word is the record's input, so rewording the instruction never changes the answer. Two
held-out sets of new words: the training phrasings, and the same tasks reworded in ways the training set never
shows (synonyms from a word list, a word dropped, the case changed, spaces doubled, a filler word). Two models
of the same size and steps (`--arch llama` or `gpt2`): one on the records as they are, one with `anvil train
--augment swap,delete,insert,synonym,case,space --synonyms LIST` (a fresh draw each epoch). `anvil compare`
gives each held-out set's exact-match difference with its paired-bootstrap interval; the result also has each
task's counts and each run's training loss (its end, and the first step below 0.05). A run already in `--work`
from the same command and training data is reused: seeds can be trained by several processes at once on one
work directory (`--first-seed 1 --seeds 2 --threads 1` beside `--first-seed 3 --seeds 2 --threads 1`), and a last
`--seeds 4 --threads 1`, once they have finished, gathers them.

    python3 bench/augment_bench.py [--anvil build/anvil] [--work DIR] [--out bench/results/FILE.json]
                                   [--train 5000 --heldout 300 --steps 8000 --seeds 1 --first-seed 1]
                                   [--augment-prob 0.2]
                                   [--tasks letters|lookup|skills --seq 64 --batch 32 --arch llama|gpt2]
"""
import hashlib
import json
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_bench_common import parse_args, report, step, write_jsonl, write_text  # noqa: E402

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
# "letters": the five letter lookups on words of one length, so that a letter sits at a fixed distance from the
# answer whatever the instruction's length, and only understanding the instruction is left to learn
TASK_SETS["letters"] = {k: v for k, v in TASK_SETS["lookup"].items() if k != "Count the letters."}
WORD_LENGTHS = {"lookup": (3, 6), "skills": (3, 6), "letters": (5, 5)}
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


def loss_curve(run_dir):
    """The run's training loss: the mean of its last five logged values, and the first step logged below 0.05
    (where the model has learned to read the letter; None if never)."""
    losses = [(m["step"], m["loss"]) for m in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))
              if "loss" in m and "step" in m]
    below = [s for s, v in losses if v < 0.05]
    return {"final": round(sum(v for _, v in losses[-5:]) / len(losses[-5:]), 4),
            "first_step_below_0.05": below[0] if below else None}


def main():
    a, A, W = parse_args("/tmp/anvil-augment", train=5000, heldout=300, steps=8000, seeds=1, first_seed=1,
                         augment_prob=0.2, tasks="letters", seq=64, batch=32, arch="llama")
    if a.tasks not in TASK_SETS:
        sys.exit(f"--tasks {a.tasks}: use {' or '.join(TASK_SETS)}")
    tasks, (shortest, longest) = TASK_SETS[a.tasks], WORD_LENGTHS[a.tasks]
    t0 = time.time()
    rnd = random.Random(1)
    seen = set()

    def record(instr=None):
        while True:
            w = "".join(rnd.choice("abcdefgh") for _ in range(rnd.randint(shortest, longest)))
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
    write_text(syn, "".join(", ".join(g) + "\n" for g in SYNONYMS))
    flags = ["--data", paths["train"], "--steps", str(a.steps), "--threads", a.threads, "--val-fraction", "0",
             "--eval-examples", "0", "--arch", a.arch, "--layers", "4", "--dim", "128", "--heads", "4",
             "--seq", str(a.seq), "--batch", str(a.batch), "--lr", "2e-3", "--warmup", "50", "--template", "compact"]
    aug = ["--augment", "swap,delete,insert,synonym,case,space", "--synonyms", syn,
           "--augment-prob", str(a.augment_prob), "--augment-p", "0.2"]
    runs = {}
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    for seed in seeds:
        for name, extra in (("plain", []), ("augment", aug)):
            run_dir = os.path.join(W, f"run_{name}_{seed}")
            cmd = [A, "train", "--out", run_dir, "--seed", str(seed), *flags, *extra]
            key = hashlib.sha256((" ".join(cmd) + open(paths["train"]).read()).encode()).hexdigest()
            key_file = os.path.join(run_dir, "bench_key")
            if not (os.path.exists(os.path.join(run_dir, "final")) and os.path.exists(key_file)
                    and open(key_file).read() == key):  # an earlier run of other flags or data is not reused
                shutil.rmtree(run_dir, ignore_errors=True)
                step(cmd, f"anvil train ({name}, seed {seed})")
                with open(key_file, "w") as f:
                    f.write(key)
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
    for seed in seeds:
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
        res["train_loss"] = {n: loss_curve(os.path.join(W, f"run_{n}_{seed}")) for n in ("plain", "augment")}
        result["seeds"][str(seed)] = res
    result["wall_s"] = round(time.time() - t0, 1)
    report(result, a.out)


if __name__ == "__main__":
    main()
