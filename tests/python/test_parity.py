"""The Python layer gives what the CLI gives on the same model: tokenize, greedy generate, stop strings."""
import json

import anvil
import numpy as np
import pytest
from conftest import TEXT, cli


def test_encode_equals_anvil_tokenize(tmp_path, trained):
    text = "the lazy dog <|endoftext|> saves nine, ünïcode ✓ and tabs\t!"
    src = tmp_path / "in.txt"
    src.write_text(text)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 20 + "ünïcode ✓\n")
    bpe = tmp_path / "bpe"
    cli("tokenizer", "train", "--in", str(corpus), "--vocab-size", "300", "--out", str(bpe))
    for spec in ("byte", str(bpe)):
        tok = anvil.Tokenizer.load(spec)
        want = [int(x) for x in cli("tokenize", "--tokenizer", spec, "--in", str(src)).stdout.split()]
        got = tok.encode(text)
        assert got.dtype == np.int32
        assert got.tolist() == want, spec
        off = [int(x) for x in cli("tokenize", "--tokenizer", spec, "--special", "off", "--in", str(src)).stdout.split()]
        assert tok.encode(text, special_tokens=False).tolist() == off
        assert tok.decode(tok.encode(text, special_tokens=False)) == text
    # a run directory: the tokenizer it was trained with
    assert anvil.Tokenizer.load(trained).vocab_size == 257


def test_render_is_the_training_template():
    tok = anvil.Tokenizer.load("byte")
    rec = {"instruction": "Add", "input": "1 2", "output": "3"}
    assert tok.render(rec, template="compact") == "Add\n1 2\n=> 3<|endoftext|>"
    assert tok.render(rec, template="compact", prompt_only=True) == "Add\n1 2\n=> "
    with pytest.raises(anvil.InputError):
        tok.render({"nope": 1})


@pytest.mark.parametrize("how", ["prompt", "instruction"])
def test_greedy_generate_equals_cli(trained, how):
    m = anvil.Model.load(trained, threads=2)
    args = ["--prompt", "the quick"] if how == "prompt" else ["--instruction", "the lazy", "--input", "dog"]
    want = json.loads(cli("generate", "--model", str(trained), *args, "--temperature", "0",
                          "--max-new-tokens", "40", "--threads", "2", "--json").stdout)
    if how == "prompt":
        got = m.generate("the quick", temperature=0, max_new_tokens=40)
    else:
        got = m.generate(instruction="the lazy", input="dog", temperature=0, max_new_tokens=40)
    assert got.text == want["text"]
    assert len(got.tokens) == want["completion_tokens"]
    assert got.finish_reason == want["finish_reason"]
    assert got.prompt_tokens == want["prompt_tokens"]
    assert "".join(m.stream("the quick", temperature=0, max_new_tokens=40)) == m.generate(
        "the quick", temperature=0, max_new_tokens=40).text


def test_sampling_is_seeded_and_stop_strings_cut(trained):
    m = anvil.Model.load(trained, threads=2)
    a = m.generate("the", temperature=1.0, seed=7, max_new_tokens=30)
    assert a.text == m.generate("the", temperature=1.0, seed=7, max_new_tokens=30).text
    want = json.loads(cli("generate", "--model", str(trained), "--prompt", "the", "--temperature", "1",
                          "--seed", "7", "--max-new-tokens", "30", "--threads", "2", "--json").stdout)
    assert a.text == want["text"]
    full = m.generate("the quick", temperature=0, max_new_tokens=40).text
    stop = full[6:9]
    cut = m.generate("the quick", temperature=0, max_new_tokens=40, stop=["zzz", stop])
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"
    # each token's log-probability, as the logits give it
    lp = m.generate("the quick", temperature=0, max_new_tokens=5, logprobs=True)
    assert len(lp.logprobs) == 5 and all(x <= 0 for x in lp.logprobs)


def test_errors_name_what_to_fix(trained, tmp_path):
    with pytest.raises(anvil.InputError, match="no such directory"):
        anvil.Model.load(tmp_path / "missing")
    m = anvil.Model.load(trained, threads=2)
    with pytest.raises(anvil.InputError, match="outside the vocabulary"):
        m.forward([[1, 2, 100000]])
    with pytest.raises(anvil.InputError, match="unknown sampling argument"):
        m.generate("x", temprature=0)
    with pytest.raises(anvil.Error, match="context"):
        m.forward(np.zeros((1, 10_000), dtype=np.int32))
    assert issubclass(anvil.InputError, anvil.Error) and issubclass(anvil.OutOfMemory, anvil.DeviceError)


def test_evaluate_equals_anvil_eval(trained, tmp_path):
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"instruction": "the quick", "input": w, "output": w[::-1]}) + "\n"
                            for w in ("fox", "dog", "lazy")))
    want = json.loads(cli("eval", "--model", str(trained), "--data", str(data), "--threads", "2", "--json").stdout)
    got = anvil.evaluate(model=trained, data=data, threads=2)
    assert got == want and "exact_match" in got


def test_run_command(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("hi")
    assert anvil.run_command("tokenize", "--tokenizer", "byte", "--in", str(src)) == 0
    with pytest.raises(anvil.InputError, match="unknown command"):
        anvil.run_command("nonsense")


def test_ctrl_c_stops_a_long_generation(trained):
    import os
    import signal
    import threading
    m = anvil.Model.load(trained, threads=2)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        m.generate("the", max_new_tokens=200_000, ignore_eos=True)  # minutes, unless Ctrl-C stops it
    assert m.generate("the", temperature=0, max_new_tokens=3).tokens.size == 3  # the model is usable after
