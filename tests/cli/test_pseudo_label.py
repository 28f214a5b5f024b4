"""anvil data pseudo-label, end to end.

A small model learns to reverse words from labelled records; pseudo-label then answers unlabelled ones. The
output keeps every other field, adds the majority answer and its provenance, and with the dropped records'
report accounts for every input record. Runs repeat byte for byte; a record's samples are the ones `anvil
generate --seed (seed + i N) --num-samples N` draws. Filters work: a --verify program that checks the reversal
keeps only correct answers; a stricter --min-agreement keeps a set at least as accurate as single samples
unfiltered. Records already labelled, a crashing checker, an empty result, a model without a tokenizer and a
bad --verify are one-line errors that leave no output file.
"""
import json
import os
import shutil
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402

MODEL = ["--layers", "2", "--heads", "2", "--dim", "48", "--seq", "48", "--batch", "16", "--template", "compact",
         "--lr", "3e-3", "--threads", "2"]
CHECKER = os.path.join(os.path.dirname(__file__), "reverse_checker.py")


def words(n):
    """Inputs drawn as common.instruction_file draws its records' (past its 400): the task the model learnt."""
    return ["".join("abcdefgh"[(i * k + 3) % 8] for k in range(1, 4 + i % 3)) for i in range(400, 400 + n)]


def lines(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


def one_line_error(r, want):
    err = r.stderr.strip().splitlines()
    return r.returncode != 0 and len(err) >= 1 and want in err[-1] and common.ONE_LINE_ERROR.match(err[-1])


def accuracy(recs):
    return sum(r["output"] == r["input"][::-1] for r in recs) / max(1, len(recs))


def main():
    f = []
    with common.TempDir() as d:
        data = common.instruction_file(d, n=400)
        run_dir = os.path.join(d, "run")
        run(["train", "--data", data, "--out", run_dir, "--steps", "150", *MODEL], check=True, timeout=300)
        model = os.path.join(run_dir, "final")
        unl = os.path.join(d, "unlabelled.jsonl")
        with open(unl, "w") as fh:
            for i, w in enumerate(words(48)):
                fh.write(json.dumps({"instruction": "Reverse.", "input": w, "id": i}) + "\n")
        base = ["data", "pseudo-label", "--model", model, "--in", unl, "--threads", "2", "--num-samples", "4",
                "--temperature", "0.8", "--seed", "11"]
        out, rep = os.path.join(d, "labelled.jsonl"), os.path.join(d, "report.jsonl")
        r = run([*base, "--out", out, "--report", rep], timeout=120)
        kept, dropped = lines(out), lines(rep)
        check(r.returncode == 0 and len(kept) + len(dropped) == 48 and len(kept) > 0,
              f"every record is kept or reported ({len(kept)} kept, {len(dropped)} dropped): {r.stderr[-300:]}", f)
        check(all(k["instruction"] == "Reverse." and "id" in k and k["output"] and k["pseudo_label"]["samples"] == 4
                  and k["pseudo_label"]["votes"] >= 1 and k["pseudo_label"]["logprob"] < 0 for k in kept),
              "kept records keep their fields and gain an output and the vote's provenance", f)
        check(f"kept {len(kept)}" in r.stdout, f"the summary counts them: {r.stdout.strip()}", f)
        first_acc = accuracy(kept)
        print(f"     pseudo-labels (4 samples, majority): {first_acc:.3f} correct")

        again = os.path.join(d, "again.jsonl")
        run([*base, "--out", again], check=True, timeout=120)
        check(open(again).read() == open(out).read(), "the same command writes the same file", f)

        # record 5's samples are generate's: seed 11 + 5 * 4, four samples
        g = run(["generate", "--model", model, "--instruction", "Reverse.", "--input", words(48)[5],
                 "--num-samples", "4", "--seed", str(11 + 5 * 4), "--temperature", "0.8", "--threads", "2",
                 "--json"], timeout=60)
        try:
            samples = [s["text"] for s in json.loads(g.stdout)["samples"]]
        except (ValueError, KeyError):
            samples = []
        mine = [dict(k["pseudo_label"], majority=k["output"]) for k in kept if k["id"] == 5] + \
            [x for x in dropped if x["line"] == 6]
        counts = Counter(samples)
        top = max(counts.values()) if samples else 0
        got = mine[0].get("majority") if mine else None
        check(got is not None and counts[got] == top == mine[0]["votes"],
              f"record 5's majority is the answer generate draws most often in its four samples "
              f"({got!r} vs {samples})", f)

        # a checker program: only true reversals pass (on 16 records: a Python process per distinct answer)
        ver, few = os.path.join(d, "verified.jsonl"), os.path.join(d, "few.jsonl")
        with open(few, "w") as fh:
            fh.writelines(open(unl).readlines()[:16])
        r = run([*base[:5], few, *base[6:], "--out", ver, "--verify", f"cmd:python3 {CHECKER}", "--jobs", "2"],
                timeout=120)
        vk = lines(ver)
        check(r.returncode == 0 and vk and accuracy(vk) == 1.0,
              f"--verify cmd: keeps only answers the program accepts ({len(vk)} kept, all correct): "
              f"{r.stderr[-300:]}", f)
        rx = os.path.join(d, "regex.jsonl")
        r = run([*base, "--out", rx, "--verify", "regex:^[a-h]{3,5}$"], timeout=120)
        check(r.returncode == 0 and all(3 <= len(k["output"]) <= 5 for k in lines(rx)),
              "--verify regex: keeps only matching answers", f)
        # filtering: unanimous votes against single unfiltered samples
        strict, single = os.path.join(d, "strict.jsonl"), os.path.join(d, "single.jsonl")
        run([*base, "--out", strict, "--min-agreement", "1"], check=True, timeout=120)
        one = [a if a != "4" else "1" for a in base]  # --num-samples 1
        run([*one, "--out", single], check=True, timeout=120)
        s_acc, u_acc = accuracy(lines(strict)), accuracy(lines(single))
        check(len(lines(single)) == 48 and s_acc >= u_acc,
              f"unanimous labels ({len(lines(strict))} kept) are at least as accurate as single samples "
              f"({s_acc:.3f} against {u_acc:.3f})", f)

        # bad input: one-line errors, no output file
        def refused(args, want, what):
            dest = os.path.join(d, "never.jsonl")
            r = run([*args, "--out", dest], timeout=120)
            check(one_line_error(r, want) and not os.path.exists(dest), f"{what}: {r.stderr.strip()[-200:]}", f)

        labelled_in = os.path.join(d, "has_output.jsonl")
        shutil.copy(data, labelled_in)
        refused([*base[:5], labelled_in, *base[6:]], "already has an \"output\"", "records already labelled")
        refused([*base, "--verify", "cmd:kill -SEGV $$"], "killed by signal", "a checker that crashes")
        refused([*base, "--verify", "cmd:/no/such/checker"], "could not run", "a checker that cannot run")
        refused([*base, "--min-logprob", "0.5"], "no record kept", "an empty result")
        refused([*base, "--verify", "grep:x"], "--verify", "an unknown --verify")
        bare = common.without_tokenizer(model, os.path.join(d, "weights_only"))
        refused([*base[:3], bare, *base[4:]], "--tokenizer", "a model without a tokenizer")
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
