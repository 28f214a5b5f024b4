#!/usr/bin/env python3
"""Oracle test for LoRA: an independent LoRA in PyTorch (Debian's python3-torch, this repository's own GPT-2 in
test_torch_oracle.py) against anvil on the same base and the same non-zero adapter, written here in PEFT's
format (adapter_config.json + adapter_model.safetensors with PEFT's names).

  1. step 0: the loss and every adapter gradient (anvil_grad_dump with the adapter), within 1e-5 relative;
  2. `anvil train --init BASE --adapter DIR` for 10 AdamW steps (only A and B trained, decay on both, clipping
     on their norm), every loss within 1e-4 relative.

The scaling alpha / r and rsLoRA's alpha / sqrt(r) are both covered. Skips (exit 77) without torch.
"""
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import test_torch_oracle as o  # noqa: E402  (skips with exit 77 when torch is missing)

torch = o.torch
TOL_GRAD, TOL_STEPS = 1e-5, 1e-4
TARGETS = ["c_attn", "c_proj"]  # PEFT's suffix matching: c_proj is both attn.c_proj and mlp.c_proj


def modules():
    out = []
    for l in range(o.L):
        for m, (fan_in, fan_out) in (("attn.c_attn", (o.C, 3 * o.C)), ("attn.c_proj", (o.C, o.C)),
                                     ("mlp.c_proj", (4 * o.C, o.C))):
            out.append((f"transformer.h.{l}.{m}", fan_in, fan_out))
    return out


def make_adapter(r):
    return {name: ((0.2 * torch.randn(r, fin)).requires_grad_(True), (0.2 * torch.randn(fout, r)).requires_grad_(True))
            for name, fin, fout in modules()}


def write_adapter(path, ad, r, alpha, rslora, base):
    os.makedirs(path)
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
               "target_modules": TARGETS, "fan_in_fan_out": True, "bias": "none", "use_rslora": rslora,
               "base_model_name_or_path": base}, open(os.path.join(path, "adapter_config.json"), "w"))
    tensors = {}
    for name, (a, b) in ad.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
    o.write_safetensors(os.path.join(path, "adapter_model.safetensors"), tensors)


def scenario(tmp, name, data_path, stream, r, alpha, rslora, B=3, T=24, accum=2, steps=10):
    failures = []
    base = os.path.join(tmp, name + "_base")
    os.makedirs(base)
    p = o.make_params()
    for t in p.values():
        t.requires_grad_(False)  # the base is frozen
    o.write_safetensors(os.path.join(base, "model.safetensors"), p)
    json.dump({"model_type": "gpt2", "n_layer": o.L, "n_head": o.NH, "n_embd": o.C, "n_positions": o.NCTX,
               "vocab_size": o.V, "anvil_tokenizer": "byte"}, open(os.path.join(base, "config.json"), "w"))
    ad = make_adapter(r)
    adir = os.path.join(tmp, name + "_adapter")
    write_adapter(adir, ad, r, alpha, rslora, base)
    s = alpha / math.sqrt(r) if rslora else alpha / r
    lora = {k: (a, b, s) for k, (a, b) in ad.items()}
    ids, score = stream

    # 1. step 0: the loss and the adapters' gradients
    gpath = os.path.join(tmp, name + "_grads.safetensors")
    o.run([o.GRAD_DUMP, base, data_path, str(B), str(T), str(accum), gpath, "alpaca", adir])
    grads, meta = o.read_safetensors(gpath)
    loss = o.step_loss(p, ids, score, 0, B, T, accum, lora)
    loss.backward()
    rl = o.rel(float(meta["loss"]), loss.item())
    print(f"[{name}] step 0 loss: anvil {float(meta['loss']):.8f} torch {loss.item():.8f} rel {rl:.2e}")
    if not rl <= TOL_GRAD:
        failures.append(f"{name}: step-0 loss differs by {rl:.2e}")
    worst = 0.0
    for k, (a, b) in ad.items():
        for part, t in (("lora_A", a), ("lora_B", b)):
            g = grads[f"{k}.{part}.weight"]
            e = float((g - t.grad).norm() / t.grad.norm().clamp_min(1e-12))
            worst = max(worst, e)
            if not e <= TOL_GRAD:
                failures.append(f"{name}: gradient of {k}.{part} differs by {e:.2e}")
    print(f"[{name}] step 0 adapter gradients: worst norm-relative error {worst:.2e} over {2 * len(ad)} tensors; "
          f"{len(grads)} gradients dumped (the base has none)")
    if len(grads) != 2 * len(ad):
        failures.append(f"{name}: anvil has {len(grads)} trainable tensors, expected the {2 * len(ad)} adapters")

    # 2. ten AdamW steps on the adapters only (llm.c's linear schedule)
    lr, warmup, wd, clip = 2e-3, 2, 0.1, 0.5
    out = os.path.join(tmp, name + "_run")
    o.run([o.ANVIL, "train", "--init", base, "--adapter", adir, "--data", data_path, "--tokenizer", "byte",
           "--shuffle", "off", "--val-fraction", "0", "--batch", str(B), "--seq", str(T), "--grad-accum", str(accum),
           "--steps", str(steps), "--lr", str(lr), "--warmup", str(warmup), "--lr-schedule", "linear",
           "--min-lr-frac", "0.1", "--weight-decay", str(wd), "--grad-clip", str(clip), "--log-every", "1",
           "--out", out, "--threads", "2"])
    anvil_losses = [json.loads(x)["loss"] for x in open(os.path.join(out, "metrics.jsonl"))]
    ad2 = {k: (a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True))
           for k, (a, b) in ad.items()}
    params = [t for ab in ad2.values() for t in ab]
    torch_losses = o.torch_adamw_losses(
        params, lambda st: o.step_loss(p, ids, score, st, B, T, accum, {k: (a, b, s) for k, (a, b) in ad2.items()}),
        steps, lr, warmup, wd, clip, group_decay=False, schedule=("linear", 0.2))
    worst = max(o.rel(a, b) for a, b in zip(anvil_losses, torch_losses))
    print(f"[{name}] {steps} AdamW steps: anvil {['%.5f' % x for x in anvil_losses]}")
    print(f"[{name}]                torch {['%.5f' % x for x in torch_losses]}  worst rel {worst:.2e}")
    if len(anvil_losses) != steps or not worst <= TOL_STEPS:
        failures.append(f"{name}: losses over {steps} steps differ by up to {worst:.2e}")
    return failures


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        rng = o.np.random.default_rng(11)
        words = ["the", "cat", "sat", "on", "a", "mat", "GPU", "tensor", "1234", "héllo", "\n", "  "]
        with open(text, "w", encoding="utf-8") as f:
            f.write(" ".join(rng.choice(words) for _ in range(1500)))
        failures += scenario(tmp, "lora", text, o.stream_from_text(text), r=4, alpha=8.0, rslora=False)
        failures += scenario(tmp, "rslora", text, o.stream_from_text(text), r=4, alpha=6.0, rslora=True)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: anvil's LoRA agrees with an independent PyTorch LoRA")
    return 0


if __name__ == "__main__":
    sys.exit(main())
