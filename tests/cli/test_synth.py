"""anvil data synth, end to end.

A small model learns rendered instruction records (as a chat model has learnt user turns), so that from its
template's start it writes questions (Magpie) and from a numbered task list it writes a new task
(Self-Instruct). What synth keeps is checked independently: no two kept questions, and no kept question and a
held-out one, reach the ROUGE-L bound (scored here by a separate implementation of ROUGE-L); every attempt is
kept or reported with its reason; answers are the model's greedy answers (`anvil generate`); runs repeat byte
for byte. Bad input (a model without a tokenizer, self-instruct without seeds, an empty result, --out over an
input) is a one-line error that leaves no output file.
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402

MODEL = ["--layers", "2", "--heads", "2", "--dim", "48", "--seq", "96", "--batch", "16", "--template", "compact",
         "--lr", "3e-3", "--threads", "2"]
OPS = {"Reverse": lambda w: w[::-1], "Uppercase": lambda w: w.upper(), "Double": lambda w: w + w,
       "First letter of": lambda w: w[0]}


def records(n, seed):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        op = r.choice(sorted(OPS))
        w = "".join(r.choice("abcdefgh") for _ in range(r.randint(3, 6)))
        out.append({"instruction": f"{op} the word {w}.", "output": OPS[op](w)})
    return out


def rouge_l(a, b):
    """ROUGE-L F-measure on lowercased alphanumeric words (rouge_score's tokenizer, no stemming)."""
    x, y = re.findall(r"[a-z0-9]+", a.lower()), re.findall(r"[a-z0-9]+", b.lower())
    if not x or not y:
        return 0.0
    prev = [0] * (len(y) + 1)
    for xi in x:
        cur = [0]
        for j, yj in enumerate(y):
            cur.append(prev[j] + 1 if xi == yj else max(prev[j + 1], cur[j]))
        prev = cur
    return 2 * prev[-1] / (len(x) + len(y))


def lines(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


def write(path, recs):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    return path


def one_line_error(r, want):
    err = r.stderr.strip().splitlines()
    return r.returncode != 0 and err and want in err[-1] and common.ONE_LINE_ERROR.match(err[-1])


def main():
    f = []
    with common.TempDir() as d:
        # rendered records as text: the model learns to write the question as well as the answer
        text = write(os.path.join(d, "text.jsonl"),
                     [{"text": f"{x['instruction']}\n=> {x['output']}"} for x in records(600, 3)])
        run(["train", "--data", text, "--out", os.path.join(d, "run"), "--steps", "300", *MODEL], check=True,
            timeout=300)
        model = os.path.join(d, "run", "final")
        base = ["data", "synth", "--model", model, "--threads", "2", "--seed", "5"]
        out, rep = os.path.join(d, "magpie.jsonl"), os.path.join(d, "report.jsonl")
        r = run([*base, "--n", "16", "--out", out, "--report", rep], timeout=120)
        kept, dropped = lines(out), lines(rep)
        m = re.search(r"kept (\d+) of (\d+) attempts", r.stdout)
        attempts = int(m.group(2)) if m else -1
        check(r.returncode == 0 and len(kept) == 16 and len(kept) + len(dropped) == attempts,
              f"magpie: 16 kept, every other attempt reported ({len(dropped)} of {attempts}): {r.stderr[-300:]}", f)
        check(all(k["instruction"] and k["output"] and k["synth"]["method"] == "magpie" for k in kept),
              "kept records: a question, an answer and their provenance", f)
        qs = [k["instruction"] for k in kept]
        worst = max(rouge_l(a, b) for i, a in enumerate(qs) for b in qs[:i])
        check(worst < 0.7, f"no two kept questions reach ROUGE-L 0.7 (highest {worst:.3f})", f)
        reasons = {x["reason"] for x in dropped}
        by_attempt = {f"attempt {k['synth']['attempt']}": k["instruction"] for k in kept}
        similar = [(x["question"], by_attempt[x["match"]], x["score"]) for x in dropped
                   if x["reason"] == "similar" and x["match"] in by_attempt]
        check(reasons <= {"unfinished", "malformed", "length", "duplicate", "similar", "near_duplicate", "no_answer"}
              and similar and all(abs(rouge_l(q, m) - score) < 1e-9 and score >= 0.7 for q, m, score in similar),
              f"the report names a reason, and a similar question the kept one it is close to, with their ROUGE-L "
              f"({sorted(reasons)}; {len(similar)} similar to a kept question)", f)
        print(f"     magpie: kept 16 of {attempts}; dropped {sorted(reasons)}")

        again = os.path.join(d, "again.jsonl")
        run([*base, "--n", "16", "--out", again], check=True, timeout=120)
        check(open(again).read() == open(out).read(), "the same command writes the same file", f)
        g = run(["generate", "--model", model, "--instruction", qs[0], "--temperature", "0", "--max-new-tokens",
                 "256", "--threads", "2", "--json"], timeout=60)
        try:
            answer = json.loads(g.stdout)["text"].strip()
        except (ValueError, KeyError):
            answer = None
        check(answer == kept[0]["output"], f"the answer is the model's greedy one ({answer!r} vs "
              f"{kept[0]['output']!r})", f)

        # leakage: with the first run's questions held out, nothing close to one of them is kept
        leak_out, leak_rep = os.path.join(d, "leak.jsonl"), os.path.join(d, "leak_report.jsonl")
        r = run([*base, "--n", "8", "--out", leak_out, "--report", leak_rep, "--against", out], timeout=120)
        lk, lr = lines(leak_out), lines(leak_rep)
        worst = max((rouge_l(a["instruction"], q) for a in lk for q in qs), default=1.0)
        leaks = [x for x in lr if x["reason"] == "leak"]
        check(r.returncode == 0 and lk and worst < 0.7 and leaks and
              all(x["match"].startswith(out + ":") for x in leaks),
              f"--against: {len(leaks)} leaks dropped, each naming the held-out line; kept ones below ROUGE-L 0.7 "
              f"with every held-out question (highest {worst:.3f})", f)

        # self-instruct: new tasks from a numbered list of seeds, none close to a seed
        seeds = write(os.path.join(d, "seeds.jsonl"), records(12, 9))
        si = os.path.join(d, "self_instruct.jsonl")
        r = run([*base, "--n", "6", "--method", "self-instruct", "--seed-file", seeds, "--shots", "2", "--out",
                 si], timeout=120)
        sk = lines(si)
        worst = max((rouge_l(a["instruction"], s["instruction"]) for a in sk for s in lines(seeds)), default=1.0)
        check(r.returncode == 0 and sk and all(k["synth"]["method"] == "self-instruct" for k in sk) and worst < 0.7,
              f"self-instruct: {len(sk)} new tasks, below ROUGE-L 0.7 with every seed (highest {worst:.3f}): "
              f"{r.stderr[-300:]}", f)

        def refused(args, want, what, dest=None):
            dest = dest or os.path.join(d, "never.jsonl")
            r = run([*args, "--out", dest], timeout=120)
            check(one_line_error(r, want) and not os.path.exists(dest) or (dest in (out, seeds) and
                  one_line_error(r, want)), f"{what}: {r.stderr.strip()[-200:]}", f)

        base += ["--n", "4"]
        refused([*base, "--min-words", "40", "--max-attempts", "20"], "no record kept", "an empty result")
        refused([*base, "--method", "self-instruct"], "--seed-file", "self-instruct without seeds")
        refused([*base, "--method", "bootstrap"], "--method", "an unknown method")
        refused([*base, "--against", out], "--against", "--out over a held-out file", dest=out)
        bare = common.without_tokenizer(model, os.path.join(d, "weights_only"))
        refused([*base[:3], bare, *base[4:]], "--tokenizer", "a model without a tokenizer")
        check(lines(out) == kept, "a refused command leaves its inputs as they were", f)
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
