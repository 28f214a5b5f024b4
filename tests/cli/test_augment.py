"""anvil data augment and anvil train --augment, at the command line.

`data augment` writes every record as it was, each followed by its copies: only the chosen fields change (the
answer and the input never do by default), each copy says which operation made it, and the same command
writes the same file. Bad input is a one-line error that leaves no output: an unknown operation, synonym
without a word list, a field that decides the answer, a malformed word list, --out over --in. `train
--augment` refuses plain text and shard directories, whose records have no fields to change.
(test_resume.py checks that an --augment run resumes bit for bit; bench/augment_bench.py measures the gain.)
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402


def lines(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


def main():
    f = []
    with common.TempDir() as d:
        src = os.path.join(d, "in.jsonl")
        recs = [{"instruction": f"Reverse the letters of word number {i} please.", "input": "abcd",
                 "output": "dcba", "id": i} for i in range(20)]
        recs.append({"text": "a plain text record"})
        with open(src, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in recs)
        syn = os.path.join(d, "syn.txt")
        with open(syn, "w") as fh:
            fh.write("# groups\nreverse, flip, invert\nletters, characters\n")
        out = os.path.join(d, "aug.jsonl")
        base = ["data", "augment", "--in", src, "--ops", "swap,delete,insert,synonym,case,space", "--copies", "3",
                "--synonyms", syn, "--p", "0.3", "--seed", "4"]
        r = run([*base, "--out", out])
        got = lines(out)
        originals = [g for g in got if "augment" not in g]
        copies = [g for g in got if "augment" in g]
        check(r.returncode == 0 and originals == recs and len(copies) >= 50,
              f"every record as it was, and copies ({len(copies)} of 60): {r.stderr[-300:]}", f)
        check(all(c["output"] == "dcba" and c["input"] == "abcd" and c["instruction"] != recs[c["id"]]["instruction"]
                  for c in copies), "copies change the instruction alone", f)
        ops = {c["augment"]["op"] for c in copies}
        check(ops == {"swap", "delete", "insert", "synonym", "case", "space"} and
              all(recs[c["augment"]["line"] - 1]["id"] == c["id"] for c in copies),
              f"each copy names its operation and its record's line ({sorted(ops)})", f)
        check(any(re.search(r"\b(flip|invert|Flip|Invert|characters)\b", c["instruction"]) for c in copies),
              "synonyms come from the word list", f)
        m = re.search(r"(\d+) records and (\d+) augmented copies", r.stdout)
        check(m and int(m.group(1)) == 21 and int(m.group(2)) == len(copies), f"the summary counts: {r.stdout}", f)
        again = os.path.join(d, "again.jsonl")
        run([*base, "--out", again], check=True)
        check(open(again).read() == open(out).read(), "the same command writes the same file", f)

        def refused(args, want, what):
            dest = os.path.join(d, "never.jsonl")
            r = run([*args, "--out", dest])
            err = r.stderr.strip().splitlines()
            check(r.returncode != 0 and err and want in err[-1] and common.ONE_LINE_ERROR.match(err[-1])
                  and not os.path.exists(dest), f"{what}: {r.stderr.strip()[-200:]}", f)

        plain = ["data", "augment", "--in", src, "--copies", "2"]
        refused([*plain, "--ops", "swap,shuffle"], "unknown operation", "an unknown operation")
        refused([*plain, "--ops", "synonym"], "--synonyms", "synonym without a word list")
        refused([*plain, "--ops", "swap", "--fields", "instruction,output"], "--fields",
                "a field that decides the answer")
        bad = os.path.join(d, "bad_syn.txt")
        with open(bad, "w") as fh:
            fh.write("reverse, flip\nlonely\n")
        refused([*plain, "--ops", "synonym", "--synonyms", bad], "line 2", "a word list line of one word")
        r = run([*plain, "--ops", "swap", "--out", src])
        check(r.returncode != 0 and "--out" in r.stderr and lines(src)[:20] == recs[:20],
              "--out over --in is refused and the input kept", f)

        text = common.text_file(d)
        r = run(["train", "--data", text, "--out", os.path.join(d, "t"), "--augment", "swap", "--steps", "1",
                 *common.TINY])
        check(r.returncode != 0 and "plain text" in r.stderr, f"train --augment on text: {r.stderr[-200:]}", f)
        r = run(["train", "--data", src, "--out", os.path.join(d, "t2"), "--augment", "swap", "--shuffle", "off",
                 "--steps", "1", *common.TINY])
        check(r.returncode != 0 and "--shuffle on" in r.stderr, f"train --augment --shuffle off: {r.stderr[-200:]}", f)
        r = run(["train", "--data", src, "--out", os.path.join(d, "t3"), "--augment", "synonym,swap", "--steps", "2",
                 *common.TINY])
        check(r.returncode != 0 and "--synonyms" in r.stderr, f"train --augment synonym without a list: "
              f"{r.stderr[-200:]}", f)
        r = run(["train", "--data", src, "--out", os.path.join(d, "t4"), "--augment", "synonym,swap", "--synonyms",
                 syn, "--steps", "2", *common.TINY])
        check(r.returncode == 0, f"train --augment on instruction records runs: {r.stderr[-200:]}", f)
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
