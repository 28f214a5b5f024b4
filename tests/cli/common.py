"""Helpers for the CLI tests: run the anvil binary, make small data and checkpoints."""
import json
import os
import re
import shutil
import subprocess
import tempfile

ANVIL = os.environ.get("ANVIL_BIN", "build/anvil")
TINY = ["--layers", "2", "--heads", "2", "--dim", "16", "--seq", "16", "--batch", "2", "--threads", "2"]


def check(cond, msg, failures):
    """Prints one ok/FAIL line and records the failure."""
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        failures.append(msg)


def report(failures, passed="PASSED"):
    """The test's exit status: lists the failures (1), or prints `passed` (0)."""
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(passed)
    return 0


def safetensors_header(path):
    """A .safetensors file's JSON header: tensor name -> {dtype, shape, data_offsets}."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n))


def run(args, timeout=120, check=False, env=None):
    r = subprocess.run([ANVIL, *args], capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"anvil {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def text_file(dir_, name="data.txt", n_words=3000):
    words = ["alpha", "beta", "gamma", "delta", "GPU", "tensor", "42", "\n"]
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        f.write(" ".join(words[(i * 7 + i // 3) % len(words)] for i in range(n_words)))
    return path


def instruction_file(dir_, name="inst.jsonl", n=300):
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        for i in range(n):
            w = "".join("abcdefgh"[(i * k + 3) % 8] for k in range(1, 4 + i % 3))
            f.write(json.dumps({"instruction": "Reverse.", "input": w, "output": w[::-1]}) + "\n")
    return path


def tiny_model(dir_):
    """Trains a tiny model for 2 steps; returns its final/ model directory."""
    data = text_file(dir_, "tiny.txt")
    out = os.path.join(dir_, "tinyrun")
    run(["train", "--data", data, "--out", out, "--steps", "2", *TINY], check=True)
    return os.path.join(out, "final")


def without_tokenizer(model, dest):
    """A copy of a model directory as save_pretrained writes a model alone: weights and config, no tokenizer."""
    os.makedirs(dest)
    shutil.copy(os.path.join(model, "model.safetensors"), dest)
    cfg = json.load(open(os.path.join(model, "config.json")))
    del cfg["anvil_tokenizer"]  # nothing says which tokenizer
    json.dump(cfg, open(os.path.join(dest, "config.json"), "w"))
    return dest


class TempDir:
    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="anvil_cli_")
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


ONE_LINE_ERROR = re.compile(r"^anvil( [a-z-]+)*: error: \S.*$")
