"""anvil data dedup: near-duplicate records and records near a held-out set are dropped, the rest kept as
written; the report names each dropped record's line and the line it is near; bad input is a one-line error
that writes nothing. `data prepare --near-dedup` drops the same copies while preparing."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402

WORDS = [f"w{i}" for i in range(500)]


def reword(text, rnd, n=1):
    words = text.split()
    for _ in range(n):
        words[rnd.randrange(len(words))] = rnd.choice(WORDS)
    return " ".join(words)


def main():
    f = []
    rnd = random.Random(7)
    with common.TempDir() as d:
        originals = [" ".join(rnd.choice(WORDS) for _ in range(60)) for _ in range(200)]
        records = [{"instruction": "Summarise.", "input": t, "output": t.split()[0]} for t in originals]
        # 20 reworded copies (one word in 60 changed: Jaccard of 5-word shingles about 0.84) after their originals
        planted = {}
        for k in range(20):
            i = 10 * k
            planted[len(records) + 1] = i + 1  # file line of the copy -> of its original
            records.append(dict(records[i], input=reword(originals[i], rnd)))
        train = os.path.join(d, "train.jsonl")
        with open(train, "w") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")
        kept, report = os.path.join(d, "kept.jsonl"), os.path.join(d, "report.jsonl")
        r = run(["data", "dedup", "--in", train, "--out", kept, "--report", report], check=True)
        lines = open(kept).read().splitlines()
        dropped = [json.loads(x) for x in open(report)]
        check(len(lines) == 200 and lines == open(train).read().splitlines()[:200],
              f"the 20 reworded copies are dropped, the 200 originals kept as written ({r.stdout.strip()})", f)
        check(sorted((x["line"], x["match"]) for x in dropped) ==
              sorted((line, f"{train}:{orig}") for line, orig in planted.items())
              and all(x["reason"] == "near_duplicate" and x["jaccard"] >= 0.8 for x in dropped),
              "the report names each copy's line, its original's and their Jaccard", f)
        # data prepare --near-dedup: the same copies dropped while preparing, named in the rejects
        prep = os.path.join(d, "prep")
        r = run(["data", "prepare", "--in", train, "--out", prep, "--near-dedup", "--threads", "2"], check=True)
        rep = json.load(open(os.path.join(prep, "report.json")))
        rejects = [json.loads(x) for x in open(os.path.join(prep, "rejects.jsonl"))]
        near = sorted((x["line"], x["detail"].split(" with ")[-1]) for x in rejects if x["reason"] == "near_duplicate")
        check(near == sorted((line, f"{train}:{orig}") for line, orig in planted.items())
              and json.dumps(rep).count("near_duplicate") >= 1,
              f"data prepare --near-dedup drops the 20 copies, each named with its original ({len(near)} dropped)",
              f)
        r = run(["data", "prepare", "--in", train, "--out", prep + "2", "--threads", "2"], check=True)
        rejects = [json.loads(x) for x in open(os.path.join(prep + "2", "rejects.jsonl"))]
        check(not rejects, "without --near-dedup they are kept (exact de-duplication alone)", f)
        # --against: training records near a held-out one go (leakage), the held-out file is untouched
        held = os.path.join(d, "held.jsonl")
        with open(held, "w") as fh:
            for i in range(5):
                fh.write(json.dumps({"instruction": "Summarise.", "input": reword(originals[100 + i], rnd),
                                     "output": "x"}) + "\n")
        clean = os.path.join(d, "clean.jsonl")
        r = run(["data", "dedup", "--in", kept, "--out", clean, "--against", held, "--report", report], check=True)
        dropped = [json.loads(x) for x in open(report)]
        check(len(open(clean).read().splitlines()) == 195
              and sorted(x["line"] for x in dropped) == [101, 102, 103, 104, 105]
              and all(x["reason"] == "near_against" for x in dropped),
              f"--against: the 5 training records near held-out ones are dropped ({r.stdout.strip()})", f)
        # a looser threshold still never drops pairs below it: unrelated records stay
        r = run(["data", "dedup", "--in", kept, "--out", clean, "--threshold", "0.3"], check=True)
        check(len(open(clean).read().splitlines()) == 200, "unrelated records are never near each other", f)
        # bad input: one-line errors, nothing written
        same = os.path.join(d, "same.jsonl")
        with open(same, "w") as fh:
            fh.write((json.dumps({"text": "a b c d e f"}) + "\n") * 3)
        out = os.path.join(d, "none.jsonl")
        r = run(["data", "dedup", "--in", same, "--out", out, "--against", same])
        check(r.returncode == 1 and "every record was dropped" in r.stderr and not os.path.exists(out),
              f"nothing left: a one-line error, no file ({r.stderr.strip()})", f)
        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w") as fh:
            fh.write('{"text": "ok"}\n{"text": \n')
        r = run(["data", "dedup", "--in", bad, "--out", out])
        check(r.returncode == 1 and f"{bad} line 2: not JSON" in r.stderr and not os.path.exists(out),
              f"a malformed line: a one-line error naming it ({r.stderr.strip()})", f)
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
