#!/usr/bin/env python3
"""Chat data from the command line (byte tokenizer; the Llama 3 and ChatML templates are checked against
transformers.js in tests/tokenizer/test_hf_tokenizers.py): JSONL {"messages": [...]} records train with the loss on
the assistant turns only (the mask checked against an independent rendering of the compact and alpaca templates),
`data prepare` keeps them and rejects bad ones with their line, `eval` scores them (loss and exact match on the last
assistant turn), `generate --chat` answers in the same rendering, and bad records and templates are one-line
errors naming the file, line or flag."""
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import ANVIL, ONE_LINE_ERROR, TempDir, check, report, run  # noqa: E402

TINY = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq", "64", "--batch", "4", "--threads", "2"]
EOT = 256
ALPACA = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
          "request.")


def chats(n, seed=7):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        msgs = [{"role": "system", "content": "Reverse each word."}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 2)):
            w = "".join(rng.choice("abcdef") for _ in range(rng.randint(2, 5)))
            msgs += [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1]}]
        out.append({"messages": msgs})
    return out


def write_jsonl(path, records, extra_lines=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


def expected(messages, template):
    """Independent rendering with the byte tokenizer: (ids, targets)."""
    ids, tgt = [], []

    def put(text, target=False):
        b = list(text.encode())
        ids.extend(b)
        tgt.extend([int(target)] * len(b))

    i = 0
    if messages[0]["role"] == "system":
        put(messages[0]["content"] + ("\n" if template == "compact" else ""))
        i = 1
    elif template == "alpaca":
        put(ALPACA)
    for m in messages[i:]:
        if m["role"] == "assistant":
            put(m["content"], True)
            ids.append(EOT)
            tgt.append(1)
        elif template == "compact":
            put(m["content"] + "\n=> ")
        else:
            put("\n\n### Instruction:\n" + m["content"] + "\n\n### Response:\n")
    return ids, tgt


def one_line_error(r, needles, what, f):
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    ok = r.returncode == 1 and ONE_LINE_ERROR.match(msg) is not None and all(n in msg for n in needles)
    check(ok, f"{what}: one-line error naming {needles} ({msg[:170]})", f)


def main():
    f = []
    with TempDir() as d:
        records = chats(400)
        data = write_jsonl(os.path.join(d, "chat.jsonl"), records)

        # 1. the rendering and the loss mask, record by record
        for tmpl in ("compact", "alpaca"):
            r = run(["tokenize", "--tokenizer", "byte", "--records", "--template", tmpl, "--in", data], check=True)
            got = [json.loads(x) for x in r.stdout.splitlines()]
            bad = [i for i, (g, rec) in enumerate(zip(got, records))
                   if (g["ids"], g["targets"]) != expected(rec["messages"], tmpl) or g["template"] != tmpl]
            check(len(got) == len(records) and not bad,
                  f"{tmpl}: ids and loss mask equal an independent rendering on {len(records) - len(bad)} of "
                  f"{len(records)} chats (loss on the assistant turns and their end-of-text only)", f)
            prompt_ok = all(g["ids"][:len(g["prompt"])] == g["prompt"] and
                            bytes(g["ids"][len(g["prompt"]):-1]).decode() == rec["messages"][-1]["content"]
                            for g, rec in zip(got, records))
            check(prompt_ok, f"{tmpl}: the generation prompt is the record up to its last answer", f)

        # 2. training on chats: the template is named, held-out chats are scored by exact match
        out = os.path.join(d, "run")
        r = run(["train", *TINY, "--data", data, "--template", "compact", "--steps", "30", "--lr", "3e-3",
                 "--eval-examples", "20", "--out", out], timeout=300)
        check(r.returncode == 0 and "template compact for instruction and chat records (as --template asks)" in r.stderr,
              "train on chat records says which template it uses", f)
        summary = json.load(open(os.path.join(out, "summary.json"))) if r.returncode == 0 else {}
        check(summary.get("exact_match_n") == 20 and summary.get("val_loss", 0) > 0,
              f"held-out chats scored: val loss {summary.get('val_loss')}, exact match on {summary.get('exact_match_n')}", f)
        cfg = json.load(open(os.path.join(out, "final", "config.json"))) if r.returncode == 0 else {}
        check(cfg.get("anvil_template") == "compact", "the checkpoint records the template", f)
        r = run(["train", *TINY, "--data", data, "--steps", "1", "--out", os.path.join(d, "auto")], timeout=300)
        check(r.returncode == 0 and "template alpaca for instruction and chat records (the tokenizer has no chat "
              "special tokens and no chat_template anvil renders)" in r.stderr, "--template auto with the byte tokenizer picks alpaca and says why", f)

        # 3. eval on chat data: loss on the answers, exact match on the last assistant turn
        r = run(["eval", "--model", out, "--data", data, "--seq", "64", "--threads", "2", "--max-examples", "10",
                 "--json"], timeout=300)
        ev = json.loads(r.stdout) if r.returncode == 0 else {}
        check(ev.get("exact_match_n") == 10 and ev.get("loss", 0) > 0,
              f"eval on chats: loss {ev.get('loss')}, exact match over {ev.get('exact_match_n')} examples", f)

        # 4. generate --chat: the same rendering as a prompt written out by hand; turns from stdin
        gen = ["generate", "--model", out, "--temperature", "0", "--max-new-tokens", "12", "--threads", "2"]
        a = run([*gen, "--chat", "--prompt", "abcd"])
        b = run([*gen, "--prompt", "abcd\n=> "])
        reply = a.stdout.rstrip("\n")
        check(a.returncode == 0 and "chat template compact" in a.stderr and b.returncode == 0 and
              b.stdout.rstrip("\n") == "abcd\n=> " + reply,
              f"generate --chat --prompt answers as the rendered prompt does ({reply!r})", f)
        def chat_stdin(text):
            return subprocess.run([ANVIL, *gen, "--chat", "--system", "Reverse each word."], input=text,
                                  capture_output=True, text=True, timeout=120)
        first = run([*gen, "--chat", "--system", "Reverse each word.", "--prompt", "abc"])
        two = chat_stdin("abc\nfed\n")
        stopped = chat_stdin("abc\nfed\n\nignored\n")
        check(two.returncode == 0 and stopped.returncode == 0 and two.stdout.startswith(first.stdout) and
              len(two.stdout) > len(first.stdout) and stopped.stdout == two.stdout,
              "generate --chat reads turns from stdin (the first reply as --prompt gives it, then a second) until "
              "an empty line", f)
        # past the context (64 tokens, 12 kept for the reply) the oldest whole turns go and the system stays
        long = chat_stdin("".join(f"turn {i}: abcdefgh\n" for i in range(8)))
        drops = re.findall(r"dropped the oldest \d+ turns?, kept the system message", long.stderr)
        check(long.returncode == 0 and len(drops) >= 2,
              f"generate --chat drops the oldest turns past the context and says so, turn after turn ({len(drops)} "
              f"times: {drops[:1] or long.stderr[-300:]!r})", f)
        one_line_error(run([*gen, "--chat", "--instruction", "x"]), ["--chat", "--instruction"], "--chat with --instruction", f)
        one_line_error(run([*gen, "--prompt", "x", "--system", "y"]), ["--system", "--chat"], "--system without --chat", f)

        # 5. data prepare keeps chats (val/test examples as chats) and rejects bad ones with their line
        bad = ['{"messages":[{"role":"tool","content":"x"},{"role":"assistant","content":"y"}]}',
               '{"messages":[{"role":"user","content":"only a question"}]}',
               '{"messages":"hello"}']
        mixed = write_jsonl(os.path.join(d, "mixed.jsonl"), records[:200], bad)
        prep = os.path.join(d, "prep")
        r = run(["data", "prepare", "--in", mixed, "--out", prep, "--template", "compact", "--val-fraction", "0.1",
                 "--test-fraction", "0"])
        rej = [json.loads(x) for x in open(os.path.join(prep, "rejects.jsonl"))] if r.returncode == 0 else []
        badrej = [x for x in rej if x["reason"] != "duplicate"]
        check([(x["line"], x["reason"]) for x in badrej] == [(201, "bad_chat"), (202, "bad_chat"), (203, "bad_chat")]
              and "unknown role \"tool\"" in badrej[0]["detail"] and "no assistant turn" in badrej[1]["detail"],
              f"data prepare rejects bad chats with their line and reason ({[x.get('detail') for x in badrej]})", f)
        dups = [x["line"] for x in rej if x["reason"] == "duplicate"]
        want_dups = [i + 1 for i, rec in enumerate(records[:200]) if rec in records[:i]]
        check(dups and sorted(dups) == want_dups, f"repeated chats are found as duplicates (lines {sorted(dups)})", f)
        val = [json.loads(x) for x in open(os.path.join(prep, "val_examples.jsonl"))] if r.returncode == 0 else []
        meta = json.load(open(os.path.join(prep, "meta.json"))) if r.returncode == 0 else {}
        check(val and all("messages" in v for v in val) and meta.get("template") == "compact",
              f"held-out chats written as chats ({len(val)}), meta.json records the template", f)
        r = run(["train", *TINY, "--data", prep, "--steps", "2", "--eval-examples", "3", "--out", os.path.join(d, "p")],
                timeout=300)
        check(r.returncode == 0, "train on the prepared chats", f)

        # 6. bad records and templates: one-line errors naming the file and line or the flag
        for i, line in enumerate(bad):
            p = write_jsonl(os.path.join(d, f"bad{i}.jsonl"), records[:3], [line])
            one_line_error(run(["train", *TINY, "--data", p, "--steps", "1", "--out", os.path.join(d, f"b{i}")]),
                           [f"bad{i}.jsonl:4:"], f"train on a bad chat record ({line[:40]})", f)
        one_line_error(run(["train", *TINY, "--data", data, "--template", "llama3", "--steps", "1", "--out",
                            os.path.join(d, "l3")]), ["--template llama3", "<|start_header_id|>"],
                       "--template llama3 with the byte tokenizer", f)
        one_line_error(run(["eval", "--model", out, "--data", data, "--template", "chatml"]),
                       ["--template chatml", "<|im_start|>"], "eval --template chatml with the byte tokenizer", f)
    return report(f, "PASSED: chat records train, prepare, evaluate and generate in one rendering")


if __name__ == "__main__":
    sys.exit(main())
