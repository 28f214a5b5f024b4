"""The package as users get it: pip install . from the checkout (the build tree ctest runs in is reused, so
nothing compiles again), help() that reads, doctor(), chat and a conversation's stream."""
import json
import os
import subprocess
import sys

import anvil
import pytest
from conftest import cli

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_pip_install(tmp_path):
    tree = os.path.dirname(os.path.dirname(os.path.abspath(anvil.__file__)))  # <build>/python -> <build>
    tree = os.path.dirname(tree)
    env = dict(os.environ, ANVIL_BUILD=tree)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--quiet",
                        "--target", str(tmp_path / "site"), ROOT], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    out = subprocess.run([sys.executable, "-c", "import anvil; print(anvil.__file__); "
                          "print(anvil.Tokenizer.load('byte').encode('ok').tolist())"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    path, ids = out.stdout.splitlines()
    assert path.startswith(str(tmp_path / "site")) and ids == "[111, 107]"
    assert (tmp_path / "site" / "anvil" / "py.typed").exists()
    assert (tmp_path / "site" / "anvil" / "_anvil.pyi").exists()


def test_help_and_doctor():
    assert "generate" in anvil.Model.__doc__ and "temperature" in anvil.Model.generate.__doc__
    assert "__dlpack__" in dir(anvil.Tensor)
    d = anvil.doctor("cpu")
    want = json.loads(cli("doctor", "--device", "cpu", "--json").stdout)
    assert d["device"] == want["device"] and d["device"]["usable"] is True
    assert set(d) == set(want)


def test_chat_and_stream_a_conversation(trained):
    m = anvil.Model.load(trained, threads=2)
    msgs = [{"role": "user", "content": "the quick"}]
    reply = m.chat(msgs, temperature=0, max_new_tokens=12)
    assert "".join(m.stream(messages=msgs, temperature=0, max_new_tokens=12)) == reply.text
    pieces = m.stream("the", temperature=0, max_new_tokens=30)
    first = next(pieces)
    pieces.close()  # leaving early ends the generation
    assert first
    with pytest.raises(anvil.InputError, match="end with a user message"):
        m.chat([{"role": "assistant", "content": "hi"}])


def test_data_prepare_quantize_and_lora_merge(trained, tmp_path):
    recs = [{"instruction": "Reverse.", "input": w, "output": w[::-1]} for w in ("fox", "dog", "lazy", "quick")]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs * 3) + "not json\n")
    report = anvil.data.prepare(in_=data, out=tmp_path / "prep", tokenizer="byte")
    assert report == json.load(open(tmp_path / "prep" / "report.json"))
    assert "bad_json" in json.dumps(report)  # the broken line is counted, by reason
    q = anvil.quantize(model=trained, out=tmp_path / "q")
    want = json.loads(cli("quantize", "--model", str(trained), "--out", str(tmp_path / "q2"), "--json").stdout)
    for k in ("tensors", "weights", "max_rel_error", "bytes_before", "bytes_after"):
        assert q[k] == want[k], k
    assert anvil.Model.load(tmp_path / "q", threads=2).generate("the", max_new_tokens=4).tokens.size == 4
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in recs * 3))
    anvil.train(init=os.path.join(trained, "final"), data=good, lora_rank=4, steps=3, out=tmp_path / "ft",
                threads=2)
    merged = anvil.lora.merge(model=os.path.join(trained, "final"), adapter=tmp_path / "ft" / "final",
                              out=tmp_path / "merged")
    assert merged["out"] == str(tmp_path / "merged") and merged["params"] > 0
    assert anvil.Model.load(tmp_path / "merged", threads=2).config["model_type"] == "gpt2"


def test_plan_is_the_commands(trained):
    p = anvil.plan(model=os.path.join(trained, "final"), tokens="1M", gpus="h100:1,l40s", price=["l40s=1.5"])
    want = json.loads(cli("plan", "--model", os.path.join(trained, "final"), "--tokens", "1M", "--gpus", "h100:1,l40s",
                          "--price", "l40s=1.5", "--json").stdout)
    assert p == want and p["rows"][0]["kind"] == "h100" and p["rows"][1]["usd_per_card_hour"] == 1.5
    with pytest.raises(anvil.InputError, match="--tokens 0"):
        anvil.plan(model=os.path.join(trained, "final"), tokens="0")
