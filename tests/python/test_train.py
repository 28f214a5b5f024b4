"""anvil.train: the command's flags as keyword arguments, in the Python process. The same flags give the
CLI's metrics.jsonl bit for bit (every field but the clocks and the machine's gauges); a callback stops a run
at a chosen step and train(resume=...) continues it bit-exactly; a bad flag raises anvil.InputError naming it;
SIGINT to the Python process leaves a resumable checkpoint."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import anvil
import pytest
from conftest import TEXT, TINY, cli

# what a step record holds that depends on the clock or the machine, not on the numbers trained
TIMING = {"cpu_util", "data_wait_ms", "elapsed_s", "fwd_bwd_ms", "mfu", "optimizer_ms", "peak_mem_mb", "rss_mb",
          "step_ms", "tokens_per_s", "eta_s", "gpu_util", "gpu_mem_mb", "power_w", "cost_usd", "comm_ms"}


def records(run):
    out = []
    for line in open(os.path.join(run, "metrics.jsonl")):
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if k not in TIMING})
    return out


def kwargs(flags):
    """TINY's flags as keyword arguments."""
    return {flags[i][2:].replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_data")
    p = d / "data.txt"
    p.write_text(TEXT * 40)
    return p


def test_train_equals_the_cli(tmp_path, data):
    cli("train", "--data", str(data), "--out", str(tmp_path / "cli"), "--steps", "12", "--log-every", "1", *TINY)
    seen = []
    summary = anvil.train(data=data, out=tmp_path / "py", steps=12, log_every=1, on_step=seen.append,
                          **kwargs(TINY))
    want, got = records(tmp_path / "cli"), records(tmp_path / "py")
    assert len(want) == 12 and got == want
    assert [r["step"] for r in seen] == list(range(1, 13)) and seen[-1]["loss"] == want[-1]["loss"]
    cli_summary = json.load(open(tmp_path / "cli" / "summary.json"))
    assert summary["train_loss"] == cli_summary["train_loss"] and summary["out"] == str(tmp_path / "py")


def test_callback_stops_and_resume_continues_bit_exactly(tmp_path, data):
    flags = dict(data=data, steps=10, log_every=1, **kwargs(TINY))
    anvil.train(out=tmp_path / "whole", **flags)
    stopped = anvil.train(out=tmp_path / "part", on_step=lambda r: r["step"] < 4, **flags)
    assert stopped["interrupted"] and stopped["steps"] == 4
    assert os.path.isdir(stopped["checkpoint"])
    anvil.train(resume=stopped["checkpoint"], out=tmp_path / "part")
    assert records(tmp_path / "part") == records(tmp_path / "whole")


def test_bad_flag_raises_naming_it(tmp_path, data):
    with pytest.raises(anvil.InputError, match="--lora-rnk"):
        anvil.train(data=data, out=tmp_path / "x", lora_rnk=8)
    with pytest.raises(anvil.InputError, match="--steps"):
        anvil.train(data=data, out=tmp_path / "y", steps=-3)

    def boom(rec):
        raise ValueError("from the callback")
    with pytest.raises(ValueError, match="from the callback"):
        anvil.train(data=data, out=tmp_path / "z", steps=5, on_step=boom, **kwargs(TINY))
    assert any(n.startswith("checkpoint-1") for n in os.listdir(tmp_path / "z"))


def test_sigint_leaves_a_resumable_checkpoint(tmp_path, data):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, anvil
        def on_step(rec):
            if rec["step"] == 3:
                os.kill(os.getpid(), signal.SIGINT)   # as Ctrl-C would
        try:
            anvil.train(data={str(data)!r}, out={str(tmp_path / "run")!r}, steps=50, on_step=on_step,
                        **{kwargs(TINY)!r})
        except KeyboardInterrupt as e:
            print("interrupted:", e)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "interrupted:" in r.stdout
    ckpts = [n for n in os.listdir(tmp_path / "run") if n.startswith("checkpoint-")]
    assert ckpts, os.listdir(tmp_path / "run")
    summary = anvil.train(resume=tmp_path / "run" / ckpts[0], steps=6)
    assert summary["steps"] == 6
    # Python's own SIGINT handling is back after the run: Ctrl-C raises KeyboardInterrupt again
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
