#!/usr/bin/env python3
"""The commands a user runs: --help everywhere, the embedded default's outputs (summary.json,
metrics.jsonl, an HF-style model directory), eval, and generate (seeded, greedy, KV-cached)."""
import json
import os
import re
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import TINY, TempDir, check, instruction_file, report, run, safetensors_header, text_file  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs")


def main():
    f = []
    for cmd in ([], ["train"], ["eval"], ["generate"]):
        r = run([*cmd, "--help"])
        check(r.returncode == 0 and "--help" in r.stdout, f"anvil {' '.join(cmd)} --help", f)
    r = run([])
    check(r.returncode == 0 and "train" in r.stdout and "Subcommands" in r.stdout, "anvil alone prints its help", f)
    r = run(["data"])
    check(r.returncode == 2 and "prepare" in r.stdout, "anvil data alone lists its subcommands", f)
    r = run(["train", "--help"])
    for flag in ("--data", "--tokenizer", "--init", "--out", "--resume", "--layers", "--heads", "--dim", "--seq",
                 "--batch", "--grad-accum", "--steps", "--lr", "--lr-schedule", "--warmup", "--weight-decay",
                 "--grad-clip", "--seed", "--shuffle", "--val-fraction", "--eval-every", "--log-every"):
        check(flag in r.stdout, f"train --help lists {flag}", f)

    with TempDir() as d:
        # the embedded default, shortened: same code path, few steps
        out = os.path.join(d, "default")
        # multiple-choice items in the embedded data's own format (HellaSwag's keys), scored with the val loss
        choices = os.path.join(d, "choices.jsonl")
        rnd = random.Random(3)
        with open(choices, "w") as fh:
            for _ in range(12):
                w = "".join(rnd.choice("abcdefg") for _ in range(5))
                fh.write(json.dumps({"ctx": f"Reverse.\n{w}\n=> ", "endings": [w, w[::-1], "".join(sorted(w))],
                                     "label": rnd.randrange(3)}) + "\n")  # some right by chance, before training
        r = run(["train", "--out", out, "--steps", "30", "--eval-examples", "20", "--eval-every", "15",
                 "--eval-choices", choices, "--eval-choices-limit", "10", "--sample-every", "15", "--sample-prompt",
                 "Reverse.\nabc\n=> ", "--sample-tokens", "6"], check=True)
        summary = default_summary = json.load(open(os.path.join(out, "summary.json")))
        for k in ("val_loss", "val_ppl", "exact_match", "tokens_per_s", "steps", "wall_s", "anvil_version"):
            check(k in summary, f"summary.json has {k}", f)
        check(summary.get("steps") == 30, "summary steps == 30", f)
        check("exact match:" in r.stdout and "validation: loss" in r.stdout, "end-of-run report printed", f)
        rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
        check(all(all(k in row for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s")) for row in rows),
              "every metrics.jsonl row has step, loss, lr, grad_norm, tokens_per_s", f)
        check(any("val_loss" in row for row in rows), "metrics.jsonl carries val_loss at --eval-every", f)
        check([r_["step"] for r_ in rows if "mc_acc" in r_ and "mc_acc_norm" in r_] == [15],
              "metrics.jsonl carries mc_acc and mc_acc_norm at --eval-every", f)
        samples = [(r_["step"], r_["sample"]) for r_ in rows if "sample" in r_]
        check([s[0] for s in samples] == [15, 30] and all(s[1].startswith("Reverse.\nabc\n=> ") for s in samples)
              and "sample at step 30:\n---\nReverse.\nabc\n=> " in r.stderr,
              f"--sample-every: the prompt and its continuation in metrics.jsonl and printed ({samples})", f)
        check(summary.get("mc_n") == 10 and 0 <= summary.get("mc_acc", -1) <= 1 and "multiple choice: acc" in r.stdout,
              "--eval-choices: the summary's mc_acc over --eval-choices-limit items, printed", f)
        check(re.search(r"eval at step 15: val loss [0-9.]+, perplexity [0-9.]+ \(best so far: saved best/\); "
                        r"multiple choice [0-9.]+% \(normalised [0-9.]+%\)", r.stderr) is not None,
              "the evaluation at step 15 printed: validation loss, best, multiple-choice accuracy", f)
        first = json.loads(open(os.path.join(out, "data.jsonl")).readline())
        check(set(first) == {"instruction", "input", "output"}, "embedded data is in the seed format", f)

        # instruction records whose responses start past --seq: no held-out targets, said so (no "loss nan")
        short = os.path.join(d, "short")
        r = run(["train", *TINY, "--data", instruction_file(d), "--steps", "2", "--eval-examples", "0", "--out", short])
        summary = json.load(open(os.path.join(short, "summary.json"))) if r.returncode == 0 else {}
        check(r.returncode == 0 and "validation: no held-out targets within --seq 16" in r.stdout and
              "nan" not in r.stdout and "val_loss" not in summary,
              "a validation set with no targets within --seq is reported as such, not as a nan loss", f)
        # ... and no training targets either: no loss of 0 in the progress, the logs or the summary
        rows = [json.loads(l) for l in open(os.path.join(short, "metrics.jsonl"))] if r.returncode == 0 else []
        check(rows and all(row["loss"] is None for row in rows) and "loss 0.0000" not in r.stderr and
              "step 1 has no loss targets" in r.stderr and "loss n/a (no targets)" in r.stderr and
              "done: 2 steps, loss n/a (no step had loss targets)" in r.stderr and
              summary.get("steps_without_targets") == 2 and summary.get("train_loss") is None,
              "training steps with no targets log a null loss and say why, never a loss of 0", f)

        # the model directory: HF config keys and tensor names/layouts; the embedded default is a Llama
        def hf_files(run_dir):
            final = os.path.join(run_dir, "final")
            return (final, json.load(open(os.path.join(final, "config.json"))),
                    safetensors_header(os.path.join(final, "model.safetensors")))

        final, cfg, header = hf_files(out)
        for k, v in (("model_type", "llama"), ("num_hidden_layers", 4), ("num_attention_heads", 4),
                     ("num_key_value_heads", 4), ("hidden_size", 128), ("intermediate_size", 384),
                     ("max_position_embeddings", 64), ("hidden_act", "silu"), ("tie_word_embeddings", False)):
            check(cfg.get(k) == v, f"config.json {k} == {v!r}", f)
        check(header.get("model.layers.0.self_attn.q_proj.weight", {}).get("shape") == [128, 128] and
              header.get("model.layers.0.mlp.gate_proj.weight", {}).get("shape") == [384, 128],
              "Llama's projections are Linear (out, in)", f)
        check(header.get("model.embed_tokens.weight", {}).get("shape") == [257, 128] and
              header.get("lm_head.weight", {}).get("shape") == [257, 128],
              "the byte vocabulary's 257 ids (a small vocabulary is not padded); the head untied", f)
        # the same flags with --arch gpt2: GPT-2's names and Conv1D layout
        gpt2 = os.path.join(d, "gpt2")
        run(["train", "--arch", "gpt2", "--out", gpt2, "--steps", "2", "--eval-examples", "1"], check=True)
        _, g_cfg, g_header = hf_files(gpt2)
        for k, v in (("model_type", "gpt2"), ("n_layer", 4), ("n_head", 4), ("n_embd", 128), ("n_positions", 64),
                     ("activation_function", "gelu_new"), ("tie_word_embeddings", True)):
            check(g_cfg.get(k) == v, f"--arch gpt2: config.json {k} == {v!r}", f)
        check(g_header.get("transformer.h.0.attn.c_attn.weight", {}).get("shape") == [128, 384],
              "c_attn is Conv1D (in, out)", f)
        check(g_header.get("transformer.wte.weight", {}).get("shape") == [257, 128] and "lm_head.weight" not in g_header,
              "wte is (vocab, width); lm_head is tied, not stored", f)
        for name in ("optimizer.safetensors", "trainer_state.json"):
            check(os.path.exists(os.path.join(final, name)), f"final/ holds {name} (resumable)", f)

        # eval on the run's data, as text and as JSON
        r = run(["eval", "--model", out, "--data", os.path.join(out, "data.jsonl"), "--max-batches", "2",
                 "--max-examples", "5", "--json"], check=True)
        ev = json.loads(r.stdout)
        check({"loss", "ppl", "exact_match"} <= set(ev), "eval --json reports loss, ppl, exact_match", f)
        # multiple choice alone, with the per-item log; the same rows in the same batches as the run's summary
        log = os.path.join(d, "scores.jsonl")
        r = run(["eval", "--model", out, "--choices", choices, "--choices-limit", "10", "--choices-log", log,
                 "--batch", "32", "--json"], check=True)
        ev = json.loads(r.stdout)
        items = [json.loads(l) for l in open(log)]
        check(set(ev) == {"mc_acc", "mc_acc_norm", "mc_n"} and ev["mc_acc"] == default_summary.get("mc_acc")
              and ev["mc_acc_norm"] == default_summary.get("mc_acc_norm"),
              f"eval --choices on the final model gives the run's accuracies ({ev})", f)
        check(len(items) == 10 and all(len(i["logprob"]) == 3 for i in items)
              and sum(i["pred"] == i["label"] for i in items) == round(10 * ev["mc_acc"]),
              "--choices-log: one line per item with its endings' scores and predictions", f)
        r = run(["eval", "--model", out])
        check(r.returncode == 1 and "give --data FILE" in r.stderr, "eval with nothing to score says what to give", f)
        bad = os.path.join(d, "bad_choices.jsonl")
        open(bad, "w").write(json.dumps({"ctx": "x", "endings": ["a", "b"], "label": 0}) + "\n{\"ctx\": \"x\"}\n")
        r = run(["eval", "--model", out, "--choices", bad])
        check(r.returncode == 1 and f"{bad}:2: no \"endings\"" in r.stderr, "a bad multiple-choice item names file:line", f)
        r = run(["train", "--out", os.path.join(d, "bad_mc"), "--steps", "1", "--eval-choices", bad])
        check(r.returncode == 1 and f"{bad}:2" in r.stderr and not os.path.exists(os.path.join(d, "bad_mc")),
              "train --eval-choices checks the file before training and leaves no run directory", f)
        r = run(["train", "--out", os.path.join(d, "bad_sample"), "--steps", "1", "--sample-every", "1",
                 "--sample-prompt", "x" * 100])
        check(r.returncode == 1 and "--sample-prompt: 100 tokens, but the model's context is 64" in r.stderr,
              "a --sample-prompt longer than the context is refused at start", f)

        # generate: greedy is deterministic; sampling is seeded
        g = ["generate", "--model", final, "--instruction", "Reverse.", "--input", "abc", "--max-new-tokens", "8"]
        a, b = run([*g, "--temperature", "0"], check=True), run([*g, "--temperature", "0"], check=True)
        check(a.stdout == b.stdout and a.stdout.startswith("Reverse.\nabc\n=> "), "greedy generate is deterministic",
              f)
        s1 = run([*g, "--temperature", "1", "--seed", "5", "--top-k", "20"], check=True).stdout
        s2 = run([*g, "--temperature", "1", "--seed", "5", "--top-k", "20"], check=True).stdout
        check(s1 == s2, "sampling with a seed is reproducible", f)
        # --json: one object with the text and the latency figures, equal to the streamed text
        j = json.loads(run([*g, "--temperature", "0", "--json"], check=True).stdout)
        check(a.stdout == "Reverse.\nabc\n=> " + j["text"] + "\n" and j["completion_tokens"] >= len(j["text"]) // 8
              and j["finish_reason"] in ("stop", "length") and j["prompt_tokens"] > 0
              and (j["finish_reason"] == "stop" or j["completion_tokens"] == 8)
              and 0 < j["time_to_first_token_ms"] <= j["total_ms"] and j["tokens_per_s"] >= 0,
              f"generate --json: text, tokens, time to first token, tokens/s, finish reason ({j})", f)
        jf = os.path.join(d, "gen.json")
        r = run([*g, "--temperature", "0", "--json", jf], check=True)
        check(r.stdout == a.stdout and json.load(open(jf))["text"] == j["text"],
              "generate --json FILE streams the text and writes the same JSON", f)
        r = run(["generate", "--model", final, "--chat", "--prompt", "hi", "--json"])
        check(r.returncode != 0 and "--json describes one completion" in r.stderr, "--json with --chat is refused", f)
        # --num-samples: sample i is the one --seed + i draws alone, streamed between lines of dashes
        hot = [*g, "--temperature", "1", "--top-k", "20"]
        many = json.loads(run([*hot, "--seed", "5", "--num-samples", "3", "--json"], check=True).stdout)["samples"]
        alone = [json.loads(run([*hot, "--seed", str(5 + i), "--json"], check=True).stdout)["text"] for i in range(3)]
        streamed = run([*hot, "--seed", "5", "-n", "3"], check=True).stdout
        check([x["text"] for x in many] == alone and streamed == "".join(
            f"Reverse.\nabc\n=> {t}\n---------------\n" for t in alone) and len(set(alone)) > 1,
              f"generate --num-samples 3: samples of seeds 5, 6, 7 ({alone})", f)
        r = run(["generate", "--model", final, "--chat", "--prompt", "hi", "--num-samples", "2"])
        check(r.returncode != 0 and "--num-samples 2: --chat answers each turn once" in r.stderr,
              "--num-samples with --chat is refused", f)
        # --prompt-file: the file's whole text is the prompt (nanoGPT's start="FILE:...")
        pf = os.path.join(d, "prompt.txt")
        open(pf, "w").write("Reverse.\nabc\n=> ")
        by_text = run(["generate", "--model", final, "--prompt", "Reverse.\nabc\n=> ", "--max-new-tokens", "8",
                       "--temperature", "0", "--json"], check=True).stdout
        by_file = run(["generate", "--model", final, "--prompt-file", pf, "--max-new-tokens", "8", "--temperature",
                       "0", "--json"], check=True).stdout
        check(json.loads(by_file)["text"] == json.loads(by_text)["text"] and json.loads(by_file)["prompt_tokens"] > 5,
              "generate --prompt-file: the same completion as the same text through --prompt", f)

        # --config: a JSON file of flags, the command line's own flags winning
        cfg = os.path.join(d, "run.json")
        json.dump({"layers": 1, "dim": 32, "heads": 2, "steps": 3, "lr_schedule": "constant", "dropout": 0.1,
                   "shuffle": "off", "lr": 2e-3, "log-every": 1}, open(cfg, "w"))
        out_cfg = os.path.join(d, "cfg")
        r = run(["train", "--config", cfg, "--data", text_file(d), "--steps", "2", "--out", out_cfg, "--seq", "16",
                 "--batch", "2", "--threads", "2"], check=True)
        o = json.load(open(os.path.join(out_cfg, "final", "trainer_state.json")))["options"]
        check({k: o[k] for k in ("layers", "dim", "steps", "lr_schedule", "shuffle")}
              == {"layers": 1, "dim": 32, "steps": 2, "lr_schedule": "constant", "shuffle": False}
              and abs(o["dropout"] - 0.1) < 1e-7 and abs(o["lr"] - 2e-3) < 1e-9
              and "--config " + cfg + ": 8 flags" in r.stderr,
              f"train --config: the file's flags, --steps from the command line ({o['layers']} layers, "
              f"{o['steps']} steps)", f)

        # --precision bf16 on the CPU: f32 tensors, bf16 products (oneDNN), said at start; checkpoints stay f32
        out_bf = os.path.join(d, "cpu_bf16")
        r = run(["train", "--data", text_file(d), "--out", out_bf, "--layers", "1", "--dim", "32", "--heads", "2",
                 "--seq", "16", "--batch", "2", "--steps", "3", "--precision", "bf16", "--device", "cpu",
                 "--threads", "2"])
        st = json.load(open(os.path.join(out_bf, "final", "trainer_state.json"))) if r.returncode == 0 else {}
        check(r.returncode == 0 and "bf16 products through oneDNN, f32 tensors" in r.stderr
              and st["options"]["precision"] == "bf16"
              and '"dtype":"F32"' in open(os.path.join(out_bf, "final", "model.safetensors"), "rb").read(4096)
              .decode("latin-1").replace(" ", ""),
              "train --precision bf16 --device cpu: bf16 products, f32 checkpoint", f)

        # every command has --config, where a required flag may be too, and a list gives a flag of several values
        gcfg = os.path.join(d, "gen.json")
        json.dump({"model": final, "instruction": "Reverse.", "input": "abc", "max_new_tokens": 8, "temperature": 0},
                  open(gcfg, "w"))
        r = run(["generate", "--config", gcfg], check=True)
        check(r.stdout == a.stdout, "generate --config: the file's --model, prompt and sampling flags", f)
        pcfg = os.path.join(d, "prep.json")
        txt = text_file(d)
        json.dump({"in": [txt, instruction_file(d)], "out": os.path.join(d, "prep"), "tokenizer": "byte"},
                  open(pcfg, "w"))
        run(["data", "prepare", "--config", pcfg], check=True)
        files = list(json.load(open(os.path.join(d, "prep", "report.json")))["inputs"])
        check(len(files) == 2, f"data prepare --config: --in from a list ({files})", f)

        # the recipes in configs/ hold only flags train takes (a small model and one step in their place)
        for name in sorted(os.listdir(CONFIGS)):
            r = run(["train", "--config", os.path.join(CONFIGS, name), "--data", text_file(d), "--tokenizer", "byte",
                     "--vocab", "320", "--out", os.path.join(d, "recipe-" + name), "--steps", "1", *TINY])
            check(r.returncode == 0 and "--config " in r.stderr, f"configs/{name} trains (one step, tiny)", f)

        # a plain text run with gradient accumulation and constant LR
        data = text_file(d)
        out2 = os.path.join(d, "text")
        run(["train", "--data", data, "--out", out2, "--steps", "4", "--grad-accum", "2", "--lr-schedule",
             "constant", "--log-every", "1", *TINY], check=True)
        lrs = [json.loads(l)["lr"] for l in open(os.path.join(out2, "metrics.jsonl"))]
        check(len(set(lrs)) == 1, "constant schedule keeps the learning rate", f)
        r = run(["generate", "--model", out2, "--prompt", "alpha", "--max-new-tokens", "40", "--temperature",
                 "0.8"], check=True)
        check(r.stdout.startswith("alpha"), "generate continues a text prompt (context 16, 40 new tokens)", f)

        # a padded vocabulary (as GPT-2's 50257 -> 50304): more embedding rows, never sampled
        out3 = os.path.join(d, "padded")
        run(["train", "--data", data, "--out", out3, "--steps", "2", "--vocab", "400", *TINY], check=True)
        cfg = json.load(open(os.path.join(out3, "final", "config.json")))
        check(cfg["vocab_size"] == 400, "--vocab 400: config.json says 400 rows", f)
        # a large vocabulary is padded to a multiple of 64 on every device (a BPE with 1100 ids -> 1152 rows)
        rng = random.Random(5)
        varied = os.path.join(d, "varied.txt")
        with open(varied, "w") as fh:
            fh.write(" ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
                              for _ in range(30000)))
        tok = os.path.join(d, "tok")
        run(["tokenizer", "train", "--in", varied, "--vocab-size", "1100", "--out", tok], check=True)
        out4 = os.path.join(d, "bpe")
        r = run(["train", "--data", varied, "--tokenizer", tok, "--out", out4, "--steps", "2", *TINY], check=True)
        cfg = json.load(open(os.path.join(out4, "final", "config.json")))
        check(cfg["vocab_size"] == 1152 and "padded from 1100 to 1152" in r.stderr,
              f"a 1100-id vocabulary is padded to 1152 rows ({cfg['vocab_size']})", f)
        r = run(["generate", "--model", out3, "--prompt", "alpha", "--max-new-tokens", "60", "--temperature", "2.0",
                 "--seed", "5"], check=True)
        check(r.returncode == 0 and r.stdout.startswith("alpha"), "a padded model samples only the tokenizer's ids", f)

    return report(f)


if __name__ == "__main__":
    sys.exit(main())
