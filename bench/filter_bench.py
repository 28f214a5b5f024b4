"""Quality filtering (issue 47's filter must-show), end to end.

Clean text: the paragraphs of at least 50 words in Debian's /usr/share/common-licenses and anvil's own docs.
A reference model trains on a part of them. The filter's input is another part with 20% of its records
corrupted the ways scraped text is (random letters, hashtag spam, numbers and tables, a paragraph's words
shuffled without its function words, one line repeated). `anvil data filter --ppl-model ref --keep-quantiles
0,Q --heuristics gopher` drops what it finds: precision and recall against the corruption. Two models train on
the unfiltered and the filtered records with equal tokens (the same steps, batch and sequence length); their
loss on held-out clean paragraphs (`anvil eval`) says whether the filter helped.

    python3 bench/filter_bench.py [--anvil build/anvil] [--work DIR] [--out bench/results/FILE.json] [--steps 600]
"""
import glob
import json
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_bench_common import parse_args, report, step, write_jsonl  # noqa: E402



def paragraphs(repo):
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
    out = []
    for f in files:
        if os.path.isdir(f) or os.path.islink(f):
            continue
        for p in re.split(r"\n\s*\n", open(f, errors="replace").read()):
            if len(p.split()) >= 50 and not p.lstrip().startswith(("```", "|")):
                out.append(" ".join(p.split()))
    return sorted(set(out))


def corrupt(p, rnd, kind):
    words = p.split()
    if kind == 0:  # random letters
        return " ".join("".join(rnd.choice("qwxzjkvbp") for _ in range(rnd.randint(4, 14))) for _ in words)
    if kind == 1:  # hashtag spam
        return " ".join("#" + rnd.choice(words).strip(".,;:()").lower() for _ in range(len(words)))
    if kind == 2:  # numbers and table debris
        return " ".join(rnd.choice([str(rnd.randint(0, 99999)), "|", "--", "0.00", "N/A"]) for _ in words)
    if kind == 3:  # shuffled content words
        stop = {"the", "be", "to", "of", "and", "that", "have", "with", "a", "in", "is", "or", "for", "this"}
        content = [w for w in words if w.lower() not in stop]
        rnd.shuffle(content)
        return " ".join(content)
    line = " ".join(words[:8])  # one line repeated
    return "\n".join([line] * (len(words) // 8 + 1))


def main():
    a, A, W = parse_args("/tmp/anvil-filter", steps=600)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.time()
    rnd = random.Random(1)
    paras = paragraphs(repo)
    rnd.shuffle(paras)
    n = len(paras)
    ref_part, input_part, held = paras[:n * 4 // 10], paras[n * 4 // 10:n * 9 // 10], paras[n * 9 // 10:]
    bad = set(rnd.sample(range(len(input_part)), len(input_part) // 5))
    recs = [{"text": corrupt(p, rnd, i % 5) if i in bad else p} for i, p in enumerate(input_part)]
    paths = {k: os.path.join(W, k) for k in ("ref.txt", "input.jsonl", "held.txt", "kept.jsonl", "scores.jsonl")}
    open(paths["ref.txt"], "w").write("\n\n".join(ref_part))
    open(paths["held.txt"], "w").write("\n\n".join(held))
    with open(paths["input.jsonl"], "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    model = ["--layers", "4", "--heads", "4", "--dim", "128", "--seq", "128", "--batch", "16", "--lr", "1e-3",
             "--warmup", "50", "--threads", a.threads, "--val-fraction", "0.05"]
    ref = os.path.join(W, "ref")
    if not os.path.exists(os.path.join(ref, "final")):
        step([A, "train", "--data", paths["ref.txt"], "--out", ref, "--steps", str(a.steps), *model],
           "the reference model")
    r = step([A, "data", "filter", "--in", paths["input.jsonl"], "--out", paths["kept.jsonl"], "--ppl-model",
            os.path.join(ref, "final"), "--keep-quantiles", "0,0.85", "--heuristics", "gopher", "--scores",
            paths["scores.jsonl"], "--threads", a.threads], "anvil data filter")
    scores = [json.loads(x) for x in open(paths["scores.jsonl"])]
    dropped = {s["line"] - 1 for s in scores if not s["kept"]}
    tp = len(dropped & bad)
    precision, recall = tp / max(1, len(dropped)), tp / len(bad)
    # equal tokens: the same steps x batch x seq; JSONL {"text"} records train as documents
    losses = {}
    for name, data in (("unfiltered", paths["input.jsonl"]), ("filtered", paths["kept.jsonl"])):
        run_dir = os.path.join(W, "run_" + name)
        if not os.path.exists(os.path.join(run_dir, "final")):
            step([A, "train", "--data", data, "--out", run_dir, "--steps", str(a.steps), *model], f"train, {name}")
        e = step([A, "eval", "--model", os.path.join(run_dir, "final"), "--data", paths["held.txt"], "--threads",
                a.threads, "--json"], f"held-out loss, {name}")
        losses[name] = json.loads(e.stdout)
    result = {"command": " ".join(sys.argv), "paragraphs": n, "reference": len(ref_part), "input": len(recs),
              "corrupted": len(bad), "heldout": len(held), "dropped": len(dropped), "precision": precision,
              "recall": recall, "filter_summary": r.stdout.strip(), "steps": a.steps,
              "heldout_eval": losses, "wall_s": round(time.time() - t0, 1)}
    report(result, a.out)


if __name__ == "__main__":
    main()
