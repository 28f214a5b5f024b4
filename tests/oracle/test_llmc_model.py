#!/usr/bin/env python3
"""llm.c's GPT-2 model files through `anvil convert`, against an independent reading of the format.

This script writes a random GPT-2 the way llm.c's train_gpt2.py does (write_model: a 256-int32 header with magic
20240326, version 3 (fp32) or 5 (bf16), then every tensor in llm.c's order, the linear weights as nn.Linear's
(out, in), the embedding padded with zero rows), and checks:
  1. `anvil convert --model FILE.bin --out DIR` gives a directory whose logits (anvil_logits_dump) equal this
     script's own PyTorch GPT-2 forward on the file's tensors (float64) within 1e-5 of the largest logit;
  2. converting that directory back gives the same bytes (version 3), and with --dtype bf16 a version-5 file
     whose tensors are this script's own bf16 rounding of them (round to nearest even), which converts back to
     a bf16 directory and to the same bytes again;
  3. a model whose embedding has exactly the tokenizer's rows (not padded) is written padded to a multiple of
     128 with zero rows, header [3] the vocabulary and [7] the rows;
  4. bad input: a cut file, an unknown version, llm.c's Llama 3 magic, no --tokenizer, a missing path, a file
     of something else, a tokenizer of another size, a Llama directory, an existing --out: each an error
     naming what is wrong, exit 1.
Skips (exit 77) without numpy and torch (.ci/run installs python3-torch).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIPPED: the llm.c model file test needs python3-numpy and python3-torch ({e})")
    sys.exit(77)

ANVIL = os.environ["ANVIL_BIN"]
LOGITS = os.environ["ANVIL_LOGITS_DUMP"]
L, NH, C, T, V, VP = 2, 4, 32, 64, 257, 384
IDS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 256, 65, 66]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def llmc_tensors(rng):
    """llm.c's tensors in file order: (name, array in llm.c's layout)."""
    def w(*shape, std=0.05):
        return (rng.standard_normal(shape) * std).astype(np.float32)
    wte = w(VP, C, std=0.1)
    wte[V:] = 0.0  # train_gpt2.py's pad_vocab
    per_layer = [("ln_1.weight", lambda: 1.0 + w(C)), ("ln_1.bias", lambda: w(C)),
                 ("attn.c_attn.weight", lambda: w(3 * C, C)), ("attn.c_attn.bias", lambda: w(3 * C)),
                 ("attn.c_proj.weight", lambda: w(C, C)), ("attn.c_proj.bias", lambda: w(C)),
                 ("ln_2.weight", lambda: 1.0 + w(C)), ("ln_2.bias", lambda: w(C)),
                 ("mlp.c_fc.weight", lambda: w(4 * C, C)), ("mlp.c_fc.bias", lambda: w(4 * C)),
                 ("mlp.c_proj.weight", lambda: w(C, 4 * C)), ("mlp.c_proj.bias", lambda: w(C))]
    out = [("wte", wte), ("wpe", w(T, C, std=0.02))]
    for name, make in per_layer:
        out += [(f"h.{l}.{name}", make()) for l in range(L)]
    return out + [("ln_f.weight", 1.0 + w(C)), ("ln_f.bias", w(C))]


def bf16_bits(a):
    """float32 -> bf16 bit patterns, rounding to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_llmc(path, tensors, version, vocab=V, padded=VP, magic=20240326):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [magic, version, T, vocab, L, NH, C, padded]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for _, a in tensors:
            f.write(a.astype("<f4").tobytes() if version == 3 else bf16_bits(a).astype("<u2").tobytes())


def forward(tensors):
    """GPT-2 on the llm.c tensors, float64: logits over the padded rows."""
    p = {k: torch.tensor(v, dtype=torch.float64) for k, v in tensors}
    ids = torch.tensor(IDS)
    n = len(IDS)
    x = p["wte"][ids] + p["wpe"][:n]
    hs = C // NH
    for l in range(L):
        g = lambda k: p[f"h.{l}.{k}"]  # noqa: E731
        h = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), 1e-5)
        q, k, v = F.linear(h, g("attn.c_attn.weight"), g("attn.c_attn.bias")).split(C, dim=1)
        q, k, v = (t.view(n, NH, hs).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(1, 2)) / hs ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(0, 1).reshape(n, C)
        x = x + F.linear(y, g("attn.c_proj.weight"), g("attn.c_proj.bias"))
        h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), 1e-5)
        h = F.gelu(F.linear(h, g("mlp.c_fc.weight"), g("mlp.c_fc.bias")), approximate="tanh")
        x = x + F.linear(h, g("mlp.c_proj.weight"), g("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte"].T


def anvil(*args):
    return subprocess.run([ANVIL, *args], capture_output=True, text=True)


def logits_of(model_dir):
    r = subprocess.run([LOGITS, model_dir, "-", ",".join(map(str, IDS))], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: anvil_logits_dump {model_dir}: {r.stderr}")
    return torch.tensor(json.loads(r.stdout), dtype=torch.float64)


def safetensors(path):
    """name -> (dtype, shape, raw bytes) of a .safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}


def expect_error(args, needle, what):
    r = anvil(*args)
    check(r.returncode == 1 and needle in r.stderr, f"{what}: {r.stderr.strip()[-220:]}")


def main():
    rng = np.random.default_rng(20261126)
    tensors = llmc_tensors(rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        write_llmc(path("m3.bin"), tensors, 3)
        # 1. to a directory: the same function as this script's forward
        r = anvil("convert", "--model", path("m3.bin"), "--out", path("hf"), "--tokenizer", "byte", "--threads", "2")
        check(r.returncode == 0, f"convert an llm.c fp32 file to a directory: {r.stdout.strip()} {r.stderr.strip()}")
        want = forward(tensors)
        got = logits_of(path("hf"))
        err = float((got - want).abs().max() / want.abs().max())
        check(got.shape == want.shape and err <= 1e-5,
              f"its logits equal an independent GPT-2 on the file's tensors: {err:.2e} of the largest")
        cfg = json.load(open(path("hf/config.json")))
        check((cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"], cfg["vocab_size"]) == (L, NH, C, T, VP),
              f"config.json has the header's shape: {cfg['n_layer']} layers, {cfg['n_embd']} wide, {cfg['vocab_size']} rows")
        st = safetensors(path("hf/model.safetensors"))
        qkv = np.frombuffer(st["transformer.h.1.attn.c_attn.weight"][2], dtype="<f4").reshape(C, 3 * C)
        check(st["transformer.h.1.attn.c_attn.weight"][1] == [C, 3 * C]
              and np.array_equal(qkv, dict(tensors)["h.1.attn.c_attn.weight"].T),
              "c_attn is Hugging Face's Conv1D (in, out), llm.c's (out, in) transposed, bit for bit")

        # 2. back to llm.c: the same bytes; bf16 rounded as llm.c rounds, and back again
        r = anvil("convert", "--model", path("hf"), "--out", path("back3.bin"), "--threads", "2")
        check(r.returncode == 0 and open(path("back3.bin"), "rb").read() == open(path("m3.bin"), "rb").read(),
              f"directory -> llm.c fp32: the original bytes {r.stderr.strip()[-200:]}")
        r = anvil("convert", "--model", path("hf"), "--out", path("m5.bin"), "--dtype", "bf16", "--threads", "2")
        write_llmc(path("want5.bin"), tensors, 5)
        check(r.returncode == 0 and open(path("m5.bin"), "rb").read() == open(path("want5.bin"), "rb").read(),
              "directory -> llm.c bf16 (version 5): every tensor rounded to nearest even, bit for bit")
        r = anvil("convert", "--model", path("m5.bin"), "--out", path("hf5"), "--tokenizer", "byte", "--threads", "2")
        st5 = safetensors(path("hf5/model.safetensors"))
        check(r.returncode == 0 and all(d == "BF16" for d, _, _ in st5.values()),
              "a version-5 file becomes a bf16 directory")
        r = anvil("convert", "--model", path("hf5"), "--out", path("back5.bin"), "--dtype", "bf16", "--threads", "2")
        check(r.returncode == 0 and open(path("back5.bin"), "rb").read() == open(path("m5.bin"), "rb").read(),
              "and back: the version-5 bytes again")

        # 3. rows == the tokenizer's vocabulary: padded to a multiple of 128 with zeros, as train_gpt2.py pads
        text = path("t.txt")
        open(text, "w").write("hello world, the llm.c files. " * 200)
        r = anvil("train", "--data", text, "--layers", "1", "--heads", "2", "--dim", "16", "--seq", "32", "--batch",
                  "2", "--steps", "1", "--threads", "2", "--device", "cpu", "--tensorboard", "off", "--out", path("run"))
        check(r.returncode == 0, "a 257-row model trains" + ("" if r.returncode == 0 else r.stderr.strip()[-200:]))
        r = anvil("convert", "--model", path("run"), "--out", path("pad.bin"), "--threads", "2")
        raw = open(path("pad.bin"), "rb").read() if r.returncode == 0 else b"\0" * 1024
        h = np.frombuffer(raw[:1024], dtype="<i4")
        wte = np.frombuffer(raw[1024:1024 + 384 * 16 * 4], dtype="<f4").reshape(384, 16) if r.returncode == 0 else None
        check(r.returncode == 0 and list(h[:8]) == [20240326, 3, 32, 257, 1, 2, 16, 384]
              and not wte[257:].any() and wte[:257].any(),
              f"257 rows written as 384, the 127 added ones zero; header {list(h[:8])}")

        # 4. bad input
        data = open(path("m3.bin"), "rb").read()
        open(path("cut.bin"), "wb").write(data[:-100])
        expect_error(["convert", "--model", path("cut.bin"), "--out", path("x"), "--tokenizer", "byte"],
                     "cut short", "a cut file is refused")
        bad = bytearray(data)
        bad[4:8] = struct.pack("<i", 4)
        open(path("v4.bin"), "wb").write(bad)
        expect_error(["convert", "--model", path("v4.bin"), "--out", path("x"), "--tokenizer", "byte"],
                     "version 4", "an unknown version is refused")
        bad[0:8] = struct.pack("<ii", 20240803, 3)
        open(path("llama3.bin"), "wb").write(bad)
        expect_error(["convert", "--model", path("llama3.bin"), "--out", path("x"), "--tokenizer", "byte"],
                     "Llama 3", "llm.c's Llama 3 files are named and refused")
        expect_error(["convert", "--model", path("m3.bin"), "--out", path("x")], "--tokenizer",
                     "an llm.c file without --tokenizer")
        expect_error(["convert", "--model", path("none.bin"), "--out", path("x")], "no such file or directory",
                     "a --model that is not there")
        expect_error(["convert", "--model", text, "--out", path("x"), "--tokenizer", "byte"],
                     "not an llm.c model file", "a file of something else")
        write_llmc(path("v300.bin"), tensors, 3, vocab=300)
        expect_error(["convert", "--model", path("v300.bin"), "--out", path("x"), "--tokenizer", "byte"],
                     "vocabulary of 300", "a tokenizer of another size")
        r = anvil("train", "--arch", "llama", "--data", text, "--layers", "1", "--heads", "2", "--dim", "16", "--seq",
                  "32", "--batch", "2", "--steps", "1", "--threads", "2", "--device", "cpu", "--tensorboard", "off",
                  "--out", path("llama"))
        expect_error(["convert", "--model", path("llama"), "--out", path("x.bin")], "hold GPT-2",
                     "a Llama directory is refused")
        expect_error(["convert", "--model", path("m3.bin"), "--out", path("hf"), "--tokenizer", "byte"],
                     "already exists", "an existing --out is kept")
        check(not os.path.exists(path("x")) and not os.path.exists(path("x.bin")), "nothing written on an error")
    if failures:
        print(f"FAILED: {len(failures)} checks")
        return 1
    print("PASSED: llm.c model files convert both ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
