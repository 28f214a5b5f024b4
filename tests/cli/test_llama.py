#!/usr/bin/env python3
"""The Llama family from the command line: a new model (--arch llama with grouped-query attention) trains,
resumes bit for bit, evaluates and generates; LoRA on it writes PEFT's names with fan_in_fan_out false; models
are written sharded (--max-shard-size) and in bf16 (lora merge --dtype) and read back; and every bad config,
shard index or flag is a one-line error naming the file and the key. The relatives in the same layout: a new
--arch qwen2 (biases on q, k, v) writes Qwen2ForCausalLM's config and bias tensors and loads back; a Mistral
config whose sliding_window is shorter than max_position_embeddings runs with the window as its context, says
so, and is written back as it came."""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import ONE_LINE_ERROR, TempDir, check, report, run, text_file  # noqa: E402
from common import safetensors_header as header  # noqa: E402

SHAPE = ["--arch", "llama", "--layers", "2", "--heads", "4", "--dim", "32", "--seq", "32", "--threads", "2", "--batch",
         "4", "--log-every", "1", "--shuffle", "off"]
LLAMA = [*SHAPE, "--kv-heads", "2"]


def losses(run_dir):
    return [json.loads(x)["loss"] for x in open(os.path.join(run_dir, "metrics.jsonl"))]


def one_line_error(r, needles, what, f):
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    ok = r.returncode == 1 and ONE_LINE_ERROR.match(msg) is not None and all(n in msg for n in needles)
    check(ok, f"{what}: one-line error naming {needles} ({msg[:170]})", f)


def eval_loss(model, data, extra=()):
    r = run(["eval", "--model", model, "--data", data, "--seq", "32", "--threads", "2", "--json", *extra], check=True)
    return json.loads(r.stdout)["loss"]


def main():
    f = []
    with TempDir() as d:
        data = text_file(d, "corpus.txt", n_words=8000)

        # 1. a new Llama: config.json as transformers writes it, sharded weights, resume bit for bit
        a = os.path.join(d, "a")
        run(["train", *LLAMA, "--data", data, "--steps", "8", "--save-every", "4", "--keep-checkpoints", "0",
             "--max-shard-size", "40K", "--out", a], check=True)
        cfg = json.load(open(os.path.join(a, "final", "config.json")))
        check(cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"] and
              cfg["num_key_value_heads"] == 2 and cfg["num_attention_heads"] == 4 and cfg["hidden_size"] == 32 and
              cfg["intermediate_size"] == 128 and cfg["tie_word_embeddings"] is False,
              f"config.json is a LlamaForCausalLM config ({ {k: cfg[k] for k in ('num_key_value_heads', 'intermediate_size')} })", f)
        index = os.path.join(a, "final", "model.safetensors.index.json")
        shards = sorted(x for x in os.listdir(os.path.join(a, "final")) if x.startswith("model-"))
        wmap = json.load(open(index))["weight_map"] if os.path.exists(index) else {}
        check(len(shards) >= 2 and shards[0].endswith(f"-of-{len(shards):05d}.safetensors") and
              set(wmap.values()) == set(shards) and "model.layers.0.self_attn.k_proj.weight" in wmap and
              "lm_head.weight" in wmap, f"--max-shard-size 40K: {len(shards)} shards with an index naming them", f)
        names = {}
        for s in shards:
            names.update(header(os.path.join(a, "final", s)))
        check(names.get("model.layers.1.self_attn.k_proj.weight", {}).get("shape") == [16, 32] and
              names.get("model.layers.0.mlp.gate_proj.weight", {}).get("shape") == [128, 32],
              "Hugging Face names and nn.Linear (out, in) shapes; k_proj has 2 key/value heads of 8", f)
        b = os.path.join(d, "b")
        shutil.copytree(a, b)
        shutil.rmtree(os.path.join(b, "final"))
        with open(os.path.join(b, "metrics.jsonl")) as fh:
            kept = fh.readlines()[:4]
        open(os.path.join(b, "metrics.jsonl"), "w").writelines(kept)
        run(["train", *LLAMA, "--data", data, "--steps", "8", "--resume", os.path.join(b, "checkpoint-4")], check=True)
        check(len(losses(b)) == 8 and losses(a) == losses(b),
              "a Llama run copied and resumed at step 4 repeats the uninterrupted run bit for bit, in the copy", f)
        r = run(["train", *SHAPE, "--data", data, "--steps", "10", "--kv-heads", "4", "--resume", a])
        one_line_error(r, ["--kv-heads 4", "2"], "resume with other --kv-heads", f)

        # 2. eval and generate on it
        base_loss = eval_loss(os.path.join(a, "final"), data)
        check(0 < base_loss < 6, f"anvil eval on the Llama: loss {base_loss:.3f}", f)
        g = run(["generate", "--model", os.path.join(a, "final"), "--prompt", "alpha beta", "--max-new-tokens", "20",
                 "--temperature", "0", "--threads", "2"])
        check(g.returncode == 0 and len(g.stdout) > 0, "anvil generate on the Llama (GQA KV cache)", f)

        # 3. LoRA on the Llama: PEFT's names, fan_in_fan_out false; merge (f32 exact, bf16 loads)
        lo = os.path.join(d, "lora")
        run(["train", "--init", os.path.join(a, "final"), "--data", data, "--lora-rank", "4", "--lora-targets",
             "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--steps", "4", "--batch", "4", "--seq", "32",
             "--threads", "2", "--lr", "1e-2", "--out", lo], check=True)
        acfg = json.load(open(os.path.join(lo, "final", "adapter_config.json")))
        ah = header(os.path.join(lo, "final", "adapter_model.safetensors"))
        check(acfg["fan_in_fan_out"] is False and
              ah.get("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {}).get("shape") == [4, 32] and
              ah.get("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", {}).get("shape") == [32, 4] and
              len([k for k in ah if k != "__metadata__"]) == 2 * 7 * 2,
              "PEFT's adapter: fan_in_fan_out false, base_model.model.model.layers.N.*.lora_A/B names", f)
        adapted = eval_loss(os.path.join(a, "final"), data, ["--adapter", os.path.join(lo, "final")])
        merged = os.path.join(d, "merged")
        run(["lora", "merge", "--model", os.path.join(a, "final"), "--adapter", os.path.join(lo, "final"), "--out",
             merged], check=True)
        m_loss = eval_loss(merged, data)
        check(abs(m_loss - adapted) <= 1e-5 * abs(adapted), f"merged loss {m_loss:.6f} = base + adapter {adapted:.6f}", f)
        m16 = os.path.join(d, "merged16")
        run(["lora", "merge", "--model", os.path.join(a, "final"), "--adapter", os.path.join(lo, "final"), "--out",
             m16, "--dtype", "bf16", "--max-shard-size", "30K"], check=True)
        h16 = {}
        for s in os.listdir(m16):
            if s.startswith("model-"):
                h16.update(header(os.path.join(m16, s)))
        dtypes = {v["dtype"] for k, v in h16.items() if k != "__metadata__"}
        l16 = eval_loss(m16, data)
        check(dtypes == {"BF16"} and json.load(open(os.path.join(m16, "config.json")))["torch_dtype"] == "bfloat16" and
              abs(l16 - adapted) < 0.05 * adapted,
              f"lora merge --dtype bf16 --max-shard-size 30K: BF16 shards that load (loss {l16:.4f})", f)

        # 4. bad input: one line naming the file and the key
        r = run(["train", "--data", data, "--steps", "1", "--kv-heads", "2", "--out", os.path.join(d, "x1")])
        one_line_error(r, ["--kv-heads", "--arch llama"], "--kv-heads without --arch llama", f)
        r = run(["train", *SHAPE, "--kv-heads", "3", "--data", data, "--steps", "1", "--out", os.path.join(d, "x2")])
        one_line_error(r, ["4 heads", "3 key/value heads"], "--kv-heads 3 with 4 heads", f)
        check(not os.path.exists(os.path.join(d, "x2")), "a refused run leaves no directory", f)

        def bad_config(name, edit, needles):
            dd = os.path.join(d, name)
            shutil.copytree(os.path.join(a, "final"), dd)
            c = json.load(open(os.path.join(dd, "config.json")))
            edit(c, dd)
            json.dump(c, open(os.path.join(dd, "config.json"), "w"))
            one_line_error(run(["eval", "--model", dd, "--data", data, "--threads", "2"]), needles, name, f)

        bad_config("unknown_type", lambda c, _: c.update(model_type="mamba"), ["config.json", "mamba", "gpt2, llama"])
        bad_config("missing_key", lambda c, _: c.pop("intermediate_size"), ["config.json", "intermediate_size"])
        bad_config("kv_not_dividing", lambda c, _: c.update(num_key_value_heads=3),
                   ["config.json", "num_key_value_heads 3"])
        bad_config("width_not_dividing", lambda c, _: (c.update(hidden_size=30), c.pop("head_dim")),
                   ["config.json", "hidden_size 30"])
        bad_config("rope_yarn", lambda c, _: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                   ["config.json", "yarn", "llama3"])
        bad_config("act", lambda c, _: c.update(hidden_act="gelu"), ["config.json", "hidden_act", "gelu"])
        bad_config("bias", lambda c, _: c.update(attention_bias=True), ["q_proj.bias", "missing"])
        bad_config("wrong_shape", lambda c, _: c.update(intermediate_size=96), ["gate_proj", "shape"])
        shutil.copytree(os.path.join(a, "final"), os.path.join(d, "control"))
        r = run(["eval", "--model", os.path.join(d, "control"), "--data", data, "--threads", "2"])
        check(r.returncode == 0, "the unchanged copy loads (the control for the cases above)", f)

        def bad_index(name, edit, needles):
            dd = os.path.join(d, name)
            shutil.copytree(os.path.join(a, "final"), dd)
            idx = json.load(open(os.path.join(dd, "model.safetensors.index.json")))
            edit(idx, dd)
            json.dump(idx, open(os.path.join(dd, "model.safetensors.index.json"), "w"))
            one_line_error(run(["eval", "--model", dd, "--data", data, "--threads", "2"]), needles, name, f)

        def missing_shard(idx, dd):
            os.remove(os.path.join(dd, shards[-1]))

        bad_index("index_missing_file", missing_shard, ["model.safetensors.index.json", shards[-1]])

        def drop_tensor(idx, dd):  # a shard rewritten without one tensor: the tensor is missing
            first = os.path.join(dd, shards[0])
            raw = open(first, "rb").read()
            (n,) = struct.unpack("<Q", raw[:8])
            h = json.loads(raw[8:8 + n])
            victim = next(k for k in h if k != "__metadata__")
            del h[victim]
            hb = json.dumps(h).encode()
            hb += b" " * ((8 - len(hb) % 8) % 8)
            open(first, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
            drop_tensor.victim = victim

        bad_index("tensor_missing", drop_tensor, ["is missing"])

        # 5. tokenizer.json of a kind anvil does not read: the error says which
        def bad_tokenizer(name, tok, needles):
            dd = os.path.join(d, name)
            os.makedirs(dd)
            json.dump(tok, open(os.path.join(dd, "tokenizer.json"), "w"))
            t = os.path.join(d, name + ".txt")
            open(t, "w").write("hello")
            one_line_error(run(["tokenize", "--tokenizer", dd, "--in", t]), needles, name, f)

        vocab = {"a": 0, "b": 1, "ab": 2}
        bad_tokenizer("tok_unigram", {"model": {"type": "Unigram", "vocab": [["a", 0.0]]}},
                      ["tokenizer.json", "Unigram"])
        bad_tokenizer("tok_pretok", {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
                                     "pre_tokenizer": {"type": "Whitespace"}}, ["tokenizer.json", "Whitespace"])
        bad_tokenizer("tok_normalizer", {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
                                         "normalizer": {"type": "Lowercase"}}, ["tokenizer.json", "Lowercase"])
        bad_tokenizer("tok_bad_regex", {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
                                        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                                            {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated",
                                             "invert": False},
                                            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}},
                      ["tokenizer.json", "does not compile"])

        # 6. the relatives: Qwen2 (q, k, v biases), Mistral (a sliding window shorter than the positions)
        q = os.path.join(d, "qwen2")
        r = run(["train", *[x if x != "llama" else "qwen2" for x in LLAMA], "--data", data, "--steps", "4",
                 "--out", q], check=True)
        qc = json.load(open(os.path.join(q, "final", "config.json")))
        qh = header(os.path.join(q, "final", "model.safetensors"))
        check(qc["model_type"] == "qwen2" and qc["architectures"] == ["Qwen2ForCausalLM"] and
              qc["use_sliding_window"] is False and qh.get("model.layers.1.self_attn.k_proj.bias", {}).get("shape") ==
              [16] and "model.layers.0.self_attn.q_proj.bias" in qh and "model.layers.0.self_attn.o_proj.bias" not in qh
              and "biases on q, k and v" in r.stderr,
              "--arch qwen2: a Qwen2ForCausalLM config.json and biases on q, k and v (not o)", f)
        check(0 < eval_loss(os.path.join(q, "final"), data) < 6, "the Qwen2 checkpoint loads back (anvil eval)", f)
        m = os.path.join(d, "mistral")
        shutil.copytree(os.path.join(a, "final"), m)
        mc = json.load(open(os.path.join(m, "config.json")))
        mc.update(model_type="mistral", architectures=["MistralForCausalLM"], max_position_embeddings=64,
                  sliding_window=16)
        for k in ("attention_bias", "mlp_bias", "pretraining_tp"):
            mc.pop(k, None)
        json.dump(mc, open(os.path.join(m, "config.json"), "w"))
        r = run(["train", "--init", m, "--data", data, "--steps", "2", "--seq", "32", "--threads", "2",
                 "--out", os.path.join(d, "mx")])
        one_line_error(r, ["--seq 32", "context of 16"], "Mistral: --seq past the sliding window", f)
        mo = os.path.join(d, "mo")
        r = run(["train", "--init", m, "--data", data, "--steps", "2", "--seq", "16", "--threads", "2", "--out", mo],
                check=True)
        back = json.load(open(os.path.join(mo, "final", "config.json")))
        check(back["model_type"] == "mistral" and back["max_position_embeddings"] == 64 and
              back["sliding_window"] == 16 and "sliding window" in r.stderr,
              "Mistral's sliding window of 16 is the context, said at start, and written back as it came", f)
        bad_config("qwen2_sliding", lambda c, _: c.update(model_type="qwen2", use_sliding_window=True),
                   ["config.json", "use_sliding_window"])
    return report(f, "PASSED: Llama from the command line")


if __name__ == "__main__":
    sys.exit(main())
