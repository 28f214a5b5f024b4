#!/usr/bin/env python3
"""anvil quantize end to end: an int8 directory (I8 weights, F32 scales, quantization_config) that eval,
generate and LoRA training load; its validation loss within 1% of the float model's; the errors a user meets."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ONE_LINE_ERROR, TempDir, check, report, run, text_file  # noqa: E402
from common import safetensors_header as header  # noqa: E402

SMALL = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq", "32", "--threads", "2"]


def one_line_error(r, needle, what, f):
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    check(r.returncode == 1 and ONE_LINE_ERROR.match(msg) is not None and needle in msg,
          f"{what}: one-line error naming {needle!r} ({msg[:160]})", f)


def val_loss(model, data):
    r = run(["eval", "--model", model, "--data", data, "--batch", "4", "--json"], check=True)
    return json.loads(r.stdout)["loss"]


def main():
    f = []
    with TempDir() as d:
        data = text_file(d, "corpus.txt", n_words=20000)
        held = text_file(d, "held.txt", n_words=3000)
        base_run = os.path.join(d, "base")
        run(["train", "--data", data, "--out", base_run, "--steps", "40", "--batch", "4", "--lr", "3e-3", *SMALL],
            check=True)
        base = os.path.join(base_run, "final")
        q = os.path.join(d, "int8")

        # 1. the directory: I8 weights with F32 scales, float norms and biases, quantization_config
        r = run(["quantize", "--model", base_run, "--out", q], check=True)
        check("to int8" in r.stdout and "smaller" in r.stdout, f"quantize reports what it did ({r.stdout.strip()})", f)
        hdr = header(os.path.join(q, "model.safetensors"))
        dt = {k: v["dtype"] for k, v in hdr.items() if k != "__metadata__"}
        check(dt.get("transformer.h.1.mlp.c_fc.weight") == "I8" and dt.get("transformer.h.1.mlp.c_fc.weight_scale")
              == "F32" and hdr["transformer.h.1.mlp.c_fc.weight_scale"]["shape"] == [128]
              and dt.get("transformer.wte.weight") == "I8" and dt.get("transformer.h.0.ln_1.weight") == "F32"
              and dt.get("transformer.h.0.attn.c_attn.bias") == "F32",
              "int8 matrices and embedding with per-output-channel F32 scales; norms and biases float", f)
        cfg = json.load(open(os.path.join(q, "config.json")))
        check(cfg.get("quantization_config", {}).get("quant_method") == "anvil-int8",
              "config.json marks the weights int8 (quantization_config)", f)
        size_f = os.path.getsize(os.path.join(base, "model.safetensors"))
        size_q = os.path.getsize(os.path.join(q, "model.safetensors"))
        check(size_q < size_f / 2.5, f"the int8 file is much smaller ({size_q} vs {size_f} bytes)", f)

        # 2. eval and generate load it; the loss stays within 1% of the float model's
        lf, lq = val_loss(base, held), val_loss(q, held)
        check(abs(lq - lf) <= 0.01 * lf, f"int8 validation loss {lq:.4f} within 1% of float {lf:.4f}", f)
        g = run(["generate", "--model", q, "--prompt", "alpha beta", "--max-new-tokens", "8", "--temperature", "0",
                 "--json"], check=True)
        out = json.loads(g.stdout)
        check(out["completion_tokens"] >= 1, f"generate runs on the int8 model ({out['text']!r})", f)

        # 3. LoRA fine-tuning on the frozen int8 base (QLoRA-style); the adapter loads back on it
        a = os.path.join(d, "qlora")
        r = run(["train", "--init", q, "--data", data, "--lora-rank", "4", "--lora-targets", "c_attn,c_proj,c_fc",
                 "--steps", "20", "--batch", "4", "--lr", "3e-3", "--log-every", "1", "--threads", "2", "--out", a],
                check=True)
        losses = [json.loads(x)["loss"] for x in open(os.path.join(a, "metrics.jsonl")) if '"loss"' in x]
        check(len(losses) == 20 and sum(losses[-5:]) < sum(losses[:5]),
              f"LoRA on the int8 base trains ({losses[0]:.3f} -> {losses[-1]:.3f})", f)
        names = sorted(os.listdir(os.path.join(a, "final")))
        check("adapter_model.safetensors" in names and "model.safetensors" not in names,
              f"only the adapter is saved ({names})", f)
        g = run(["generate", "--model", a, "--prompt", "alpha", "--max-new-tokens", "4", "--temperature", "0"])
        check(g.returncode == 0, f"the adapter generates on its int8 base (exit {g.returncode} {g.stderr[-200:]})", f)

        # 4. errors
        one_line_error(run(["train", "--init", q, "--data", data, "--steps", "1", "--threads", "2", "--out",
                            os.path.join(d, "full")]), "--lora-rank", "full fine-tuning of int8 weights", f)
        one_line_error(run(["quantize", "--model", q, "--out", os.path.join(d, "twice")]), "int8 already",
                       "quantizing int8 weights again", f)
        one_line_error(run(["quantize", "--model", base, "--out", q]), "--overwrite", "an existing --out", f)
        one_line_error(run(["lora", "merge", "--model", q, "--adapter", os.path.join(a, "final"), "--out",
                            os.path.join(d, "merged")]), "anvil quantize", "merging into int8 weights", f)
        bad = os.path.join(d, "bad")
        os.makedirs(bad)
        for name in os.listdir(q):
            os.symlink(os.path.join(q, name), os.path.join(bad, name))
        os.remove(os.path.join(bad, "config.json"))
        cfg["quantization_config"]["quant_method"] = "bitsandbytes"
        json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
        one_line_error(run(["eval", "--model", bad, "--data", held]), "quant_method \"bitsandbytes\"",
                       "another tool's quantization", f)

        # 5. a model directory saved without tokenizer files (save_pretrained of a model alone): the commands
        # that only move weights need none, carry over what there is, and take --tokenizer to add one
        bare = os.path.join(d, "bare")
        os.makedirs(bare)
        os.symlink(os.path.join(base, "model.safetensors"), os.path.join(bare, "model.safetensors"))
        bcfg = json.load(open(os.path.join(base, "config.json")))
        kind = bcfg.pop("anvil_tokenizer")
        bcfg.pop("anvil_template", None)
        json.dump(bcfg, open(os.path.join(bare, "config.json"), "w"))
        bq = os.path.join(d, "bare_int8")
        r = run(["quantize", "--model", bare, "--out", bq])
        check(r.returncode == 0 and sorted(os.listdir(bq)) == ["config.json", "model.safetensors"],
              f"quantize of a model without tokenizer files (exit {r.returncode}: {r.stderr.strip()[-160:]})", f)
        one_line_error(run(["eval", "--model", bq, "--data", held]), "--tokenizer",
                       "eval of a model without a tokenizer names --tokenizer", f)
        r = run(["eval", "--model", bq, "--tokenizer", kind, "--data", held, "--batch", "4", "--json"])
        check(r.returncode == 0 and abs(json.loads(r.stdout)["loss"] - lq) < 1e-6 * lq,
              f"... which it takes: the loss of the int8 model ({r.stderr.strip()[-120:]})", f)
        r = run(["quantize", "--model", bare, "--tokenizer", kind, "--out", os.path.join(d, "bare_int8_tok")])
        tok_cfg = json.load(open(os.path.join(d, "bare_int8_tok", "config.json"))) if r.returncode == 0 else {}
        check(tok_cfg.get("anvil_tokenizer") == kind, f"quantize --tokenizer saves it ({r.stderr.strip()[-160:]})", f)
        lora = os.path.join(d, "lora_f32")
        run(["train", "--init", base, "--data", data, "--lora-rank", "2", "--steps", "2", "--batch", "2",
             "--threads", "2", "--out", lora], check=True)
        r = run(["lora", "merge", "--model", bare, "--adapter", os.path.join(lora, "final"), "--out",
                 os.path.join(d, "bare_merged")])
        check(r.returncode == 0, f"lora merge into a model without tokenizer files ({r.stderr.strip()[-160:]})", f)
        r = run(["convert", "--model", bare, "--out", os.path.join(d, "bare.bin")])
        check(r.returncode == 0 and os.path.getsize(os.path.join(d, "bare.bin")) > 0,
              f"convert of a model without tokenizer files to llm.c ({r.stderr.strip()[-160:]})", f)
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
