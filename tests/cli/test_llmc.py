#!/usr/bin/env python3
"""llm.c's token shards as --data: a directory of *_train*.bin / *_val*.bin files (a 1024-byte header of 256
int32: magic 20240520, version 1, the token count; then uint16 ids) trains exactly as the same tokens in
anvil's own shards do (`anvil data prepare`'s, read back here): the same losses and validation losses bit for
bit, shuffled and in order, with the training split in two files; `anvil eval` scores its validation split;
damaged shards, ids past the vocabulary and a missing --tokenizer are one-line errors naming the file."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import ONE_LINE_ERROR, TINY, TempDir, check, report, run  # noqa: E402

EOT = 256  # the byte tokenizer's end-of-text id


def anvil_shard_ids(path):
    """The ids of an anvil shard (docs/data.md: 64-byte header; width at 12, count at 24)."""
    raw = open(path, "rb").read()
    width, = struct.unpack_from("<I", raw, 12)
    count, = struct.unpack_from("<Q", raw, 24)
    return list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", raw, 64))


def write_llmc(path, ids, magic=20240520, version=1, count=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", magic, version, len(ids) if count is None else count, *([0] * 253)))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def losses(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [r["loss"] for r in rows], [r["val_loss"] for r in rows if "val_loss" in r]


def main():
    f = []
    with TempDir() as d:
        # documents of different lengths: records end at each <|endoftext|>
        ins = []
        for i in range(12):
            p = os.path.join(d, f"doc{i}.txt")
            open(p, "w").write(" ".join(["alpha", "beta", "gamma", "GPU", "42\n"][(i + k) % 5] for k in range(60 + 37 * i)))
            ins.append(p)
        prep = os.path.join(d, "prep")
        run(["data", "prepare", "--in", *ins, "--out", prep, "--tokenizer", "byte", "--val-fraction", "0.2"],
            check=True)
        meta = json.load(open(os.path.join(prep, "meta.json")))
        train = [i for name in meta["splits"]["train"]["files"] for i in anvil_shard_ids(os.path.join(prep, name))]
        val = [i for name in meta["splits"]["val"]["files"] for i in anvil_shard_ids(os.path.join(prep, name))]
        # llm.c's layout: the training split in two files, cut after an end-of-text (a record boundary)
        cut = [k for k, t in enumerate(train) if t == EOT][len([t for t in train if t == EOT]) // 2] + 1
        llmc = os.path.join(d, "llmc")
        os.makedirs(llmc)
        write_llmc(os.path.join(llmc, "docs_train_000001.bin"), train[:cut])
        write_llmc(os.path.join(llmc, "docs_train_000002.bin"), train[cut:])
        write_llmc(os.path.join(llmc, "docs_val_000000.bin"), val)

        common = [*TINY, "--steps", "8", "--log-every", "1", "--eval-every", "4", "--eval-examples", "0"]
        for shuffle in ("on", "off"):
            a = run(["train", "--data", prep, "--shuffle", shuffle, "--out", os.path.join(d, "a" + shuffle), *common])
            b = run(["train", "--data", llmc, "--tokenizer", "byte", "--shuffle", shuffle,
                     "--out", os.path.join(d, "b" + shuffle), *common])
            same = a.returncode == 0 and b.returncode == 0 and \
                losses(os.path.join(d, "a" + shuffle)) == losses(os.path.join(d, "b" + shuffle))
            check(same and len(losses(os.path.join(d, "b" + shuffle))[1]) == 1,
                  f"llm.c shards train as anvil's shards of the same tokens, bit for bit (--shuffle {shuffle})", f)
        check(f"{len(train)} train tokens, {len(val)} val tokens (llm.c GPT-2 shards, 3 files)" in b.stderr,
              "the run says what it read", f)
        summary = json.load(open(os.path.join(d, "boff", "summary.json")))
        r = run(["eval", "--model", os.path.join(d, "boff"), "--data", llmc, "--batch", "2", "--seq", "16", "--json"])
        ev = json.loads(r.stdout) if r.returncode == 0 else {}
        check(ev.get("loss") == summary.get("val_loss") and ev.get("targets", 0) > 0,
              f"eval --data on llm.c shards scores their validation split ({ev.get('loss')} vs {summary.get('val_loss')})", f)
        r = run(["eval", "--model", os.path.join(d, "aoff"), "--data", prep, "--batch", "2", "--seq", "16", "--json"])
        check(r.returncode == 0 and json.loads(r.stdout).get("loss") == summary.get("val_loss"),
              "eval --data on a prepared directory scores its validation split", f)

        def error(args, needle, what):
            r = run(["train", *args, *TINY, "--steps", "1", "--out", os.path.join(d, "bad")])
            line = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            check(r.returncode == 1 and needle in line and ONE_LINE_ERROR.match(line) is not None,
                  f"{what}: {line}", f)

        error(["--data", llmc], "give --tokenizer with that tokenizer", "llm.c shards without --tokenizer")
        bad = os.path.join(d, "bad_llmc")
        os.makedirs(bad)
        write_llmc(os.path.join(bad, "x_train.bin"), train[:100], count=101)
        error(["--data", bad, "--tokenizer", "byte"], f"{bad}/x_train.bin: the header counts 101 tokens",
              "a truncated shard")
        write_llmc(os.path.join(bad, "x_train.bin"), train[:100] + [300])
        error(["--data", bad, "--tokenizer", "byte"], "token 100 is id 300, outside the tokenizer's 257 ids",
              "an id past the vocabulary")
        write_llmc(os.path.join(bad, "x_train.bin"), train[:100], magic=20240521)
        error(["--data", bad, "--tokenizer", "byte"], "not an llm.c token shard (magic 20240521, version 1",
              "a wrong magic")
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
