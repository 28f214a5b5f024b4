"""Fixtures of the Python layer's tests: the anvil binary and package of one build tree (ANVIL_BIN, and
PYTHONPATH=<build>/python, which ctest sets), a small model trained by the CLI, and the PyTorch oracles of
tests/oracle (an independent GPT-2 and Llama)."""
import os
import subprocess
import sys

import pytest

ANVIL = os.environ.get("ANVIL_BIN", "build/anvil")
ORACLE_DIR = os.path.join(os.path.dirname(__file__), "..", "oracle")
# the small model every test may share (as tests/cli/common.py's TINY, wider, trained long enough to write the
# text back, so greedy answers are plain ASCII)
TINY = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq", "32", "--batch", "4", "--threads", "2"]
TEXT = "the quick brown fox jumps over the lazy dog. a stitch in time saves nine.\n"


def cli(*args, check=True):
    r = subprocess.run([ANVIL, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"anvil {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
    return r


@pytest.fixture(scope="session")
def anvil_bin():
    return ANVIL


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A GPT-2-family run directory trained by `anvil train` for 150 steps on a repeated sentence (the byte
    tokenizer), and its data file."""
    d = tmp_path_factory.mktemp("trained")
    data = d / "data.txt"
    data.write_text(TEXT * 60)
    cli("train", "--data", str(data), "--out", str(d / "run"), "--steps", "150", "--lr", "3e-3", *TINY)
    return d / "run"


@pytest.fixture(scope="session")
def oracles():
    """tests/oracle's GPT-2 (test_torch_oracle) and Llama (test_llama_oracle) modules."""
    pytest.importorskip("torch")
    os.environ.setdefault("ANVIL_BIN", ANVIL)
    os.environ.setdefault("ANVIL_GRAD_DUMP", "")
    sys.path.insert(0, ORACLE_DIR)
    import test_llama_oracle as llama
    import test_torch_oracle as gpt2
    return gpt2, llama
