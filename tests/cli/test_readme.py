#!/usr/bin/env python3
"""The README and docs/ tell the truth about the command line.

Every `anvil ...` synopsis in a fenced block of README.md and docs/*.md names a real (sub)command whose --help
exits 0 and lists every flag the synopsis shows; every flag in the README's `anvil train` table is in
`anvil train --help`; and the quick commands run for real, as written (doctor, bench, tokenize, tokenizer
train, data prepare, train, eval, generate, plot).
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import TINY, TempDir, check, report, run, text_file  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def fenced_blocks(path):
    blocks, cur = [], None
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            if cur is None:
                cur = []
            else:
                blocks.append(cur)
                cur = None
        elif cur is not None:
            cur.append(line.rstrip("\n"))
    return blocks


def synopses(path):
    """(command words, flags, text) for each `anvil ...` line of a fenced block, with its continuation lines."""
    out = []
    for block in fenced_blocks(path):
        cur = None
        for line in block:
            if line.startswith("anvil "):
                if cur:
                    out.append(cur)
                words = []
                for w in line.split()[1:]:
                    if not re.fullmatch(r"[a-z][a-z-]*", w):
                        break
                    words.append(w)
                cur = [words, set(), line]
            elif cur and line.startswith(" "):
                cur[2] += "\n" + line
            elif cur:
                out.append(cur)
                cur = None
            if cur:
                cur[1] |= set(FLAG.findall(line))
        if cur:
            out.append(cur)
    return out


def help_flags(words):
    r = run([*words, "--help"])
    return r.returncode, set(FLAG.findall(r.stdout))


def synopsis_checks(f):
    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    n = 0
    for path in docs:
        for words, flags, text in synopses(path):
            # a synopsis line documents a command; an example line (with values) is run below or elsewhere
            rc, known = help_flags(words)
            missing = sorted(flags - known)
            where = f"{os.path.basename(path)}: anvil {' '.join(words)}"
            check(rc == 0, f"{where} --help exits 0", f)
            check(not missing, f"{where}: every flag shown is in --help" + (f" (missing {missing})" if missing else ""),
                  f)
            n += 1
    check(n >= 10, f"{n} command lines checked in README.md and docs/", f)

    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    table = readme[readme.index("`anvil train` flags"):]
    table = table[:table.index("\n\n", table.index("| --- |"))]
    _, train_flags = help_flags(["train"])
    listed = set(FLAG.findall(table))
    check(len(listed) > 40 and not (listed - train_flags),
          f"the README's train flag table ({len(listed)} flags) matches train --help"
          + (f" (missing {sorted(listed - train_flags)})" if listed - train_flags else ""), f)


def real_runs(f):
    """The README's and docs' commands as a user types them, on small inputs."""
    with TempDir() as d:
        data = text_file(d, "corpus.txt", n_words=8000)
        inst = os.path.join(d, "inst.jsonl")
        with open(inst, "w") as fh:
            for i in range(200):
                w = "".join("abcdefgh"[(i * k + 1) % 8] for k in range(1, 5 + i % 3))
                fh.write(json.dumps({"instruction": "Reverse.", "input": w, "output": w[::-1]}) + "\n")
        steps = [
            ["doctor"],
            ["doctor", "--device", "cpu", "--json"],
            ["bench", "--device", "cpu", "--quick", "--price-per-hour", "0.5", "--json"],
            ["tokenize", "--tokenizer", "byte", "--in", data],
            ["tokenizer", "train", "--in", data, "--vocab-size", "300", "--out", os.path.join(d, "tok")],
            ["data", "prepare", "--in", inst, "--out", os.path.join(d, "prep"), "--val-fraction", "0.1"],
            ["train", "--data", os.path.join(d, "prep"), "--out", os.path.join(d, "run"), "--steps", "3", *TINY],
            ["train", "--resume", os.path.join(d, "run"), "--steps", "5"],
            ["train", "--init", os.path.join(d, "run", "final"), "--data", inst, "--out", os.path.join(d, "ft"),
             "--steps", "2", "--batch", "2", "--threads", "2"],
            ["eval", "--model", os.path.join(d, "run"), "--data", inst, "--max-batches", "2", "--max-examples", "3"],
            ["generate", "--model", os.path.join(d, "run"), "--instruction", "Reverse.", "--input", "abc",
             "--max-new-tokens", "8", "--temperature", "0"],
            ["generate", "--model", os.path.join(d, "run"), "--prompt", "ab", "--max-new-tokens", "8", "--top-k", "5",
             "--top-p", "0.9", "--seed", "3"],
            ["plot", os.path.join(d, "run"), "--out", os.path.join(d, "run.svg")],
            ["plan", "--layers", "48", "--heads", "25", "--dim", "1600", "--seq", "1024", "--tokens", "10B"],
        ]
        for args in steps:
            r = run(args, timeout=300)
            check(r.returncode == 0, f"anvil {' '.join(a if not a.startswith(d) else '…' for a in args)}"
                  + ("" if r.returncode == 0 else f" -> exit {r.returncode}: {r.stderr.strip()[-300:]}"), f)


def main():
    f = []
    synopsis_checks(f)
    real_runs(f)
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
