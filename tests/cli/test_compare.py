"""anvil eval --per-example and anvil compare, end to end.

Two runs on the same instruction records and held-out split (40 and 150 steps): each keeps its final
evaluation's records in eval_examples.jsonl, whose exact answers add up to the summary's exact match and whose
answer losses average near its validation loss. `anvil eval --per-example` on the held-out records gives the
run's own file. Each record's answer log-probability equals, within 1e-4, the one `anvil serve` gives for the
same token ids with echo (another path: the KV-cached scheduler, itself checked against PyTorch). `anvil
compare` on the runs: the longer one is better on loss with the interval below 0, a file against itself
differs by nothing; mismatched records, a missing file and --per-example without instruction records are
one-line errors.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serve"))
from test_serve import Server  # noqa: E402

MODEL = ["--layers", "2", "--heads", "2", "--dim", "48", "--seq", "48", "--batch", "16", "--template", "compact",
         "--val-fraction", "0.15", "--eval-examples", "40", "--lr", "3e-3", "--threads", "2"]


def records(path):
    return [json.loads(line) for line in open(path)]


def one_line_error(r, want):
    lines = r.stderr.strip().splitlines()
    return r.returncode != 0 and len(lines) == 1 and want in lines[0] and common.ONE_LINE_ERROR.match(lines[0])


def served_logprobs(model, tokenized, recs, failures):
    """Each record's answer log-probability through `anvil serve`: its ids up to its last target, echoed
    with max_tokens 0, the mean over the answer's positions."""
    srv = Server(model)
    try:
        worst = 0.0
        for t, rec in zip(tokenized, recs):
            last = max(i for i, m in enumerate(t["targets"]) if m)
            ids, n_prompt = t["ids"][:last + 1], len(t["prompt"])
            st, r = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})
            lps = r["choices"][0]["logprobs"]["token_logprobs"] if st == 200 else None
            if lps is None:
                check(False, f"serve scores the record's ids ({st}: {r})", failures)
                return
            mine = sum(lps[n_prompt:]) / (len(ids) - n_prompt)
            worst = max(worst, abs(mine - rec["logprob"]))
            if len(ids) - n_prompt != rec["answer_tokens"]:
                check(False, f"the answer's token count: {rec['answer_tokens']} against {len(ids) - n_prompt}",
                      failures)
        check(worst < 1e-4, f"each record's answer log-probability equals serve's echo of the same ids "
                            f"(largest difference {worst:.2e} over {len(recs)} records)", failures)
    finally:
        srv.stop()


def main():
    f = []
    with common.TempDir() as d:
        data = common.instruction_file(d, n=400)
        runs = {}
        for steps in (40, 150):
            out = os.path.join(d, f"run{steps}")
            run(["train", "--data", data, "--out", out, "--steps", str(steps), *MODEL], check=True, timeout=300)
            runs[steps] = out
        for steps, out in runs.items():
            summary = json.load(open(os.path.join(out, "summary.json")))
            recs = records(os.path.join(out, "eval_examples.jsonl"))
            exact = sum(r["exact"] for r in recs) / len(recs)
            loss = -sum(r["logprob"] for r in recs) / len(recs)
            check(len(recs) == summary["exact_match_n"] == 40 and exact == summary["exact_match"]
                  and [r["index"] for r in recs] == list(range(40)),
                  f"run of {steps} steps: eval_examples.jsonl holds its 40 held-out records, "
                  f"{exact:.3f} exact as the summary says", f)
            check(all(r["output"] == r["expected"] for r in recs if r["exact"]) and all(
                r["logprob"] < 0 and r["answer_tokens"] >= 2 for r in recs),
                  f"run of {steps} steps: exact records answered the expected text, log-probabilities < 0", f)
            # the records' mean answer loss against the run's validation loss (the same targets, weighted
            # by record rather than by token)
            check(abs(loss - summary["val_loss"]) < 0.15 * summary["val_loss"] + 0.01,
                  f"run of {steps} steps: mean answer loss {loss:.4f} near the validation loss "
                  f"{summary['val_loss']:.4f}", f)

        # the held-out records as a file: eval --per-example gives the run's own records
        recs = records(os.path.join(runs[150], "eval_examples.jsonl"))
        all_recs = [json.loads(line) for line in open(data)]
        by_prompt = {f"{r['instruction']}\n{r['input']}\n=> ": r for r in all_recs}
        held = os.path.join(d, "held.jsonl")
        with open(held, "w") as fh:
            for r in recs:
                fh.write(json.dumps(by_prompt[r["prompt"]]) + "\n")
        mine = os.path.join(d, "mine.jsonl")
        r = run(["eval", "--model", os.path.join(runs[150], "final"), "--data", held, "--template", "compact",
                 "--per-example", mine, "--max-examples", "0", "--threads", "2", "--json"], check=True)
        ev = json.loads(r.stdout)
        got = records(mine)
        same = all(a["exact"] == b["exact"] and a["output"] == b["output"] and abs(a["logprob"] - b["logprob"]) < 1e-5
                   for a, b in zip(got, recs))
        check(len(got) == 40 and same and ev["exact_match"] == sum(x["exact"] for x in got) / 40,
              f"eval --per-example on the held-out records gives the run's own results ({ev})", f)
        tok = run(["tokenize", "--tokenizer", "byte", "--in", held, "--records", "--template", "compact"], check=True)
        tokenized = [json.loads(line) for line in tok.stdout.splitlines() if line.strip()]
        served_logprobs(os.path.join(runs[150], "final"), tokenized[:12], got[:12], f)

        # compare: the longer run is better on loss; a file against itself differs by nothing
        r = run(["compare", runs[40], runs[150], "--metric", "loss", "--json", "--bootstrap", "2000"], check=True)
        c = json.loads(r.stdout)
        check(c["n"] == 40 and c["diff"] < 0 and c["interval"][1] < 0 and c["interval"][0] <= c["diff"],
              f"compare --metric loss: the 150-step run's loss is lower, the interval below 0 ({c['diff']:.3f}, "
              f"{c['interval']})", f)
        r = run(["compare", runs[40], runs[150], "--metric", "loss"], check=True)
        check("B is better: the 95% interval is below 0" in r.stdout, f"the text says B is better:\n{r.stdout}", f)
        r = run(["compare", mine, mine, "--json"], check=True)
        c = json.loads(r.stdout)
        check(c["diff"] == 0 and c["interval"] == [0, 0] and c["p_value"] == 1,
              f"a file against itself: no difference ({c['diff']}, {c['interval']})", f)

        # bad input: one-line errors
        five = os.path.join(d, "five.jsonl")
        run(["eval", "--model", os.path.join(runs[150], "final"), "--data", held, "--template", "compact",
             "--per-example", five, "--max-examples", "5", "--threads", "2"], check=True)
        r = run(["compare", mine, five])
        check(one_line_error(r, "holds 40 records and") and "holds 5" in r.stderr,
              f"records that differ in number: a one-line error ({r.stderr.strip()})", f)
        r = run(["compare", mine, os.path.join(d, "nothing.jsonl")])
        check(one_line_error(r, "nothing.jsonl: no such file"), f"a missing file: a one-line error ({r.stderr.strip()})", f)
        text = common.text_file(d, "plain.txt", 400)
        r = run(["eval", "--model", os.path.join(runs[150], "final"), "--data", text, "--per-example",
                 os.path.join(d, "x.jsonl")])
        check(one_line_error(r, "holds no instruction records") and not os.path.exists(os.path.join(d, "x.jsonl")),
              f"--per-example on plain text: a one-line error, no file written ({r.stderr.strip()})", f)
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
