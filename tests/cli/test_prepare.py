#!/usr/bin/env python3
"""anvil data prepare: validation report, --strict, CSV, text, binary garbage, dedup, planted leaks, and
training from the prepared directory."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import TempDir, check, report, run  # noqa: E402


def rejects(out):
    return [json.loads(l) for l in open(os.path.join(out, "rejects.jsonl"))]


def main():
    f = []
    with TempDir() as d:
        # 1. every kind of bad record, with its line
        src = os.path.join(d, "mixed.jsonl")
        lines = [
            json.dumps({"instruction": "Reverse.", "input": "abc", "output": "cba"}),  # 1 ok
            '{"instruction": "Reverse.", "input": "abd"',                             # 2 bad JSON
            json.dumps({"instruction": "Reverse.", "input": "abe"}),                  # 3 missing output
            json.dumps({"text": "   "}),                                              # 4 empty text
            "[1, 2, 3]",                                                              # 5 not an object
            json.dumps({"instruction": "Reverse.", "input": "abc", "output": "cba"}),  # 6 duplicate of 1
            "",                                                                       # 7 blank: skipped
            json.dumps({"text": "plain text record"}),                                # 8 ok
            json.dumps({"text": 42}),                                                 # 9 not a string
        ]
        with open(src, "wb") as fh:
            fh.write(("\n".join(lines) + "\n").encode())
            fh.write(b'{"text": "bad \xff bytes"}\n')                                  # 10 invalid UTF-8
        out = os.path.join(d, "mixed")
        r = run(["data", "prepare", "--in", src, "--out", out, "--val-fraction", "0"])
        check(r.returncode == 0, "prepare succeeds with rejections", f)
        got = {(x["line"], x["reason"]) for x in rejects(out)}
        want = {(2, "bad_json"), (3, "missing_field"), (4, "empty_text"), (5, "not_object"), (6, "duplicate"),
                (9, "not_string"), (10, "invalid_utf8")}
        check(got == want, f"every rejected record listed with its line and reason ({sorted(got)})", f)
        rep = json.load(open(os.path.join(out, "report.json")))
        check(rep["records_in"] == 9 and rep["splits"]["train"]["records"] == 2,
              f"counts in (9) and out (2): {rep['records_in']}, {rep['splits']['train']['records']}", f)
        check(all(x["file"] == src for x in rejects(out)), "rejections name the file", f)

        # 2. --strict: nothing written, the report beside it
        out2 = os.path.join(d, "strict")
        r = run(["data", "prepare", "--in", src, "--out", out2, "--strict"])
        check(r.returncode == 1 and not os.path.exists(out2) and os.path.exists(out2 + ".report.json"),
              "--strict fails, writes no shards, leaves the report", f)
        check("--strict" in r.stderr.strip().splitlines()[-1], "--strict error is one line naming the flag", f)

        # 3. CSV: quoted commas and newlines, a short row, the column by flag
        csvp = os.path.join(d, "data.csv")
        with open(csvp, "w") as fh:
            fh.write('id,body\n1,"hello, world"\n2,"two\nlines"\n3\n4,fine\n')
        out3 = os.path.join(d, "csv")
        r = run(["data", "prepare", "--in", csvp, "--out", out3, "--csv-column", "body", "--val-fraction", "0"])
        check(r.returncode == 0, "CSV prepared", f)
        rj = rejects(out3)
        check([(x["line"], x["reason"]) for x in rj] == [(5, "bad_csv")],
              f"the short CSV row is rejected at its line 5 ({[(x['line'], x['reason']) for x in rj]})", f)
        check(json.load(open(os.path.join(out3, "report.json")))["splits"]["train"]["records"] == 3,
              "three CSV records kept (one spans two lines)", f)

        # 4. text files: split by position; an empty file is a rejection
        txt = os.path.join(d, "book.txt")
        words = ["alpha", "beta", "gamma", "delta", "epsilon"]
        rng = random.Random(1)
        with open(txt, "w") as fh:
            fh.write(" ".join(rng.choice(words) for _ in range(400_000)))
        empty = os.path.join(d, "empty.txt")
        open(empty, "w").close()
        out4 = os.path.join(d, "text")
        r = run(["data", "prepare", "--in", txt, empty, "--out", out4, "--val-fraction", "0.1", "--test-fraction",
                 "0.1"])
        rep = json.load(open(os.path.join(out4, "report.json")))
        t, v, s = (rep["splits"][k]["tokens"] for k in ("train", "val", "test"))
        check(r.returncode == 0 and abs(v / (t + v + s) - 0.1) < 0.02 and abs(s / (t + v + s) - 0.1) < 0.02,
              f"a 2.4 MB text file splits 80/10/10 by position ({t}/{v}/{s})", f)
        check([(x["file"], x["reason"]) for x in rejects(out4)] == [(empty, "empty_text")], "empty file rejected", f)

        # 5. binary garbage as JSONL: counted rejections, no crash
        garbage = os.path.join(d, "garbage.jsonl")
        grng = random.Random(2)
        with open(garbage, "wb") as fh:
            fh.write(bytes(grng.getrandbits(8) for _ in range(20000)))
        out5 = os.path.join(d, "garbage")
        r = run(["data", "prepare", "--in", garbage, src, "--out", out5])
        n = len(rejects(out5))
        check(r.returncode == 0 and n > 10, f"binary garbage: {n} rejected lines, exit {r.returncode}", f)

        # 6. planted leaks: near-copies (a shared paragraph plus a different tail) must be reported
        # whenever the two land on different sides of the split, and nothing else may be.
        leak_src = os.path.join(d, "leak.jsonl")
        rng = random.Random(3)
        vocab = [f"w{i}" for i in range(5000)]
        recs = []
        for i in range(300):
            para = " ".join(rng.choice(vocab) for _ in range(40))
            recs.append({"instruction": "Summarize.", "input": f"doc {i}", "output": para})
            if i % 3 == 0:  # its twin: same paragraph, another ending
                recs.append({"instruction": "Summarize.", "input": f"doc {i} copy", "output": para + " the end"})
        with open(leak_src, "w") as fh:
            for x in recs:
                fh.write(json.dumps(x) + "\n")
        out6 = os.path.join(d, "leak")
        run(["data", "prepare", "--in", leak_src, "--out", out6, "--val-fraction", "0.3"],
            check=True)
        val = [json.loads(l) for l in open(os.path.join(out6, "val_examples.jsonl"))]
        val_keys = {x["input"] for x in val}
        base = lambda k: k.replace(" copy", "")  # noqa: E731
        twins = {base(x["input"]) for x in recs if x["input"].endswith("copy")}
        expected = {k for k in val_keys if base(k) in twins and
                    ({base(k), base(k) + " copy"} - val_keys)}  # its twin went to training
        rep = json.load(open(os.path.join(out6, "report.json")))
        line_of = {x["input"]: i + 1 for i, x in enumerate(recs)}
        reported = {int(x["where"].rsplit(":", 1)[1]) for x in rep["leakage"]["records"]}
        want_lines = {line_of[k] for k in expected}
        check(len(want_lines) > 5 and reported == want_lines,
              f"leakage check finds exactly the {len(want_lines)} planted near-duplicates "
              f"(reported {len(reported)}, missed {len(want_lines - reported)}, extra {len(reported - want_lines)})", f)

        # 7. training reads the prepared directory (its tokenizer and template)
        out7 = os.path.join(d, "run")
        r = run(["train", "--data", out6, "--out", out7, "--steps", "3", "--layers", "1", "--dim", "16", "--heads",
                 "2", "--seq", "32", "--batch", "2", "--eval-examples", "3"], check=True)
        check(os.path.exists(os.path.join(out7, "summary.json")), "anvil train --data PREPARED_DIR runs", f)
        meta = json.load(open(os.path.join(out6, "meta.json")))
        state = json.load(open(os.path.join(out7, "final", "trainer_state.json")))
        check(state["data"]["fingerprint"] == meta["fingerprint"], "the run records the shards' fingerprint", f)
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
