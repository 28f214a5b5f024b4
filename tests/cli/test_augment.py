"""anvil data augment and anvil train --augment, at the command line.

`data augment` writes every record as it was, each followed by its copies: only the chosen fields change (the
answer and the input never do by default), each copy says which operation made it, and the same command
writes the same file. Bad input is a one-line error that leaves no output: an unknown operation, synonym
without a word list, a field that decides the answer, a malformed word list, --out over --in. With paraphrase, a model
rewrites the instruction, and --check-model keeps a copy only where its answer is the original's. `train
--augment` refuses plain text and shard directories, whose records have no fields to change.
(test_resume.py checks that an --augment run resumes bit for bit; bench/augment_bench.py measures the gain.)
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402


def lines(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


def greedy(model, rec):
    g = run(["generate", "--model", model, "--instruction", rec["instruction"], "--input", rec["input"],
             "--temperature", "0", "--max-new-tokens", "32", "--threads", "2", "--json"])
    try:
        return json.loads(g.stdout)["text"]
    except (ValueError, KeyError):
        return None


def paraphrases(d, f):
    """A small model that knows two phrasings of each task and to reword one into the other (`Reword.`)
    paraphrases records; with --check-model, only copies it answers as it answers the original stay."""
    rnd = random.Random(1)
    tasks = [("Reverse the word.", "Flip the letters.", lambda w: w[::-1]),
             ("Uppercase the word.", "Write it in capitals.", lambda w: w.upper()),
             ("Double the word.", "Say the word twice.", lambda w: w + w)]
    word = lambda: "".join(rnd.choice("abcdefgh") for _ in range(rnd.randint(3, 5)))  # noqa: E731
    recs = []
    for _ in range(900):
        a, b, op = rnd.choice(tasks)
        w = word()
        recs.append({"instruction": rnd.choice([a, b]), "input": w, "output": op(w)})
    for _ in range(300):
        a, b, _ = rnd.choice(tasks)
        x, y = (a, b) if rnd.random() < 0.5 else (b, a)
        recs.append({"instruction": "Reword.", "input": x, "output": y})
    rnd.shuffle(recs)
    train = os.path.join(d, "para_train.jsonl")
    with open(train, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)
    run(["train", "--data", train, "--out", os.path.join(d, "para"), "--steps", "400", "--layers", "2", "--heads",
         "2", "--dim", "64", "--seq", "64", "--batch", "16", "--template", "compact", "--lr", "3e-3", "--threads",
         "2"], check=True, timeout=300)
    model = os.path.join(d, "para", "final")
    src = os.path.join(d, "para_in.jsonl")
    with open(src, "w") as fh:
        for i in range(12):
            a, _, op = tasks[i % 3]
            w = word()
            fh.write(json.dumps({"instruction": a, "input": w, "output": op(w)}) + "\n")
    originals = lines(src)
    base = ["data", "augment", "--in", src, "--ops", "paraphrase", "--paraphrase-model", model,
            "--paraphrase-prompt", "Reword.", "--copies", "2", "--threads", "2"]
    out, checked = os.path.join(d, "para_out.jsonl"), os.path.join(d, "para_checked.jsonl")
    r = run([*base, "--out", out], timeout=120)
    para = [x for x in lines(out) if "augment" in x]
    orig = {x["augment"]["line"]: originals[x["augment"]["line"] - 1] for x in para}
    check(r.returncode == 0 and para and all(
        x["augment"]["op"] == "paraphrase" and x["instruction"] != orig[x["augment"]["line"]]["instruction"]
        and x["input"] == orig[x["augment"]["line"]]["input"] and x["output"] == orig[x["augment"]["line"]]["output"]
        for x in para), f"paraphrase: {len(para)} copies, each a rewritten instruction, input and answer kept: "
        f"{r.stdout.strip()[-300:]} {r.stderr[-200:]}", f)
    r = run([*base, "--out", checked, "--check-model", model], timeout=120)
    kept = [x for x in lines(checked) if "augment" in x]
    check(r.returncode == 0 and all(k in para for k in kept),
          f"--check-model keeps {len(kept)} of the {len(para)} paraphrases", f)
    same = [greedy(model, k) == greedy(model, orig[k["augment"]["line"]]) for k in kept[:3]]
    check(all(same), f"the check model answers each kept copy as its original ({same})", f)
    refused = run(["data", "augment", "--in", src, "--ops", "paraphrase,swap", "--out", os.path.join(d, "n.jsonl")])
    check(refused.returncode != 0 and "--paraphrase-model" in refused.stderr and
          not os.path.exists(os.path.join(d, "n.jsonl")), "paraphrase without a model is refused", f)
    refused = run(["data", "augment", "--in", src, "--ops", "swap", "--check-model", model, "--out",
                   os.path.join(d, "n.jsonl")])
    check(refused.returncode != 0 and "paraphrase" in refused.stderr, "--check-model without paraphrase", f)


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
        paraphrases(d, f)
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
