#!/usr/bin/env python3
"""Oracle test: an independent GPT-2 in PyTorch against anvil.

PyTorch makes random GPT-2 weights and writes them as a Hugging Face model directory (config.json +
model.safetensors, written here by this script's own writer). anvil then
  1. computes step 0's loss and gradients from that directory (anvil_grad_dump), and
  2. trains 10 AdamW steps from it (`anvil train --init DIR --shuffle off ...`).
PyTorch reproduces both from the README's contract alone: the data order, the prompt template and loss
mask, the learning-rate schedule, AdamW with nanoGPT's decay grouping, global-norm clipping. Losses and
gradients must agree within 1e-4 relative (gradients: per tensor, in norm).

Skips (exit 77, a visible notice in ctest) when torch is not installed; .ci/run installs python3-torch.
"""
import json
import math
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
    print(f"SKIPPED: PyTorch oracle needs python3-torch and python3-numpy ({e}); "
          "install them with apt-get (Debian's python3, /usr/bin/python3)")
    sys.exit(77)

ANVIL = os.environ["ANVIL_BIN"]
GRAD_DUMP = os.environ["ANVIL_GRAD_DUMP"]
TOL = 1e-4
EOT = 256

torch.manual_seed(1234)
torch.set_num_threads(2)

L, NH, C, NCTX, V = 2, 2, 32, 64, 257


# ---- safetensors, written and read independently of anvil -------------------------------------------
def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().cpu().contiguous().numpy().astype(np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", e
        b, end = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:end], dtype=np.float32).reshape(e["shape"]).copy())
    return out, meta


# ---- the model ---------------------------------------------------------------------------------------
def make_params():
    p = {"transformer.wte.weight": torch.randn(V, C) * 0.1, "transformer.wpe.weight": torch.randn(NCTX, C) * 0.1}
    for l in range(L):
        h = f"transformer.h.{l}."
        p[h + "ln_1.weight"] = 1 + 0.1 * torch.randn(C)
        p[h + "ln_1.bias"] = 0.1 * torch.randn(C)
        p[h + "attn.c_attn.weight"] = 0.1 * torch.randn(C, 3 * C)
        p[h + "attn.c_attn.bias"] = 0.1 * torch.randn(3 * C)
        p[h + "attn.c_proj.weight"] = 0.1 * torch.randn(C, C)
        p[h + "attn.c_proj.bias"] = 0.1 * torch.randn(C)
        p[h + "ln_2.weight"] = 1 + 0.1 * torch.randn(C)
        p[h + "ln_2.bias"] = 0.1 * torch.randn(C)
        p[h + "mlp.c_fc.weight"] = 0.1 * torch.randn(C, 4 * C)
        p[h + "mlp.c_fc.bias"] = 0.1 * torch.randn(4 * C)
        p[h + "mlp.c_proj.weight"] = 0.1 * torch.randn(4 * C, C)
        p[h + "mlp.c_proj.bias"] = 0.1 * torch.randn(C)
    p["transformer.ln_f.weight"] = 1 + 0.1 * torch.randn(C)
    p["transformer.ln_f.bias"] = 0.1 * torch.randn(C)
    return {k: v.float().requires_grad_(True) for k, v in p.items()}


def dropout_keep(seed, n, p):
    """anvil's dropout mask (docs/architecture.md): element i of n is kept when the top 24 bits of
    SplitMix64's finaliser of seed + (i + 1) * golden reach p * 2^24."""
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)) >= np.uint64(int(float(np.float32(p)) * 16777216.0))


def dropout_site_seed(pass_seed, site):
    """The seed of dropout site `site` of a pass: 0 the embeddings, 1 + 2l layer l's attention output, 2 + 2l
    its MLP output, 2^32 + l its attention probabilities (whose heads' seeds are this function again, of that
    seed and the head)."""
    m = (1 << 64) - 1
    z = pass_seed ^ (((site + 1) * 0xD1B54A32D192ED03) & m)
    z = ((z ^ (z >> 31)) * 0x7FB5D329728EA185) & m
    z = ((z ^ (z >> 27)) * 0x81DADEF4BC2DD44D) & m
    return z ^ (z >> 33)


def forward(p, idx, lora=None, drop=None):
    """GPT-2 on parameters p (HF names). lora: {module name: (A (r, in), B (out, r), scaling)} adds
    scaling * (x A^T) B^T to that Conv1D's output, as PEFT's LoRA does. drop: (probability, pass seed), the
    dropout of a training pass on the embeddings, on the attention probabilities and on each block's attention
    and MLP output."""
    B, T = idx.shape
    hs = C // NH
    lora = lora or {}

    def dropout(x, site):
        if not drop:
            return x
        pr, seed = drop
        keep = dropout_keep(dropout_site_seed(seed, site), x.numel(), pr).reshape(tuple(x.shape))
        return x * torch.from_numpy(keep).float() * (1.0 / (1.0 - np.float32(pr)))

    def attn_dropout(att, l):
        """Probability (b, h, i, j) kept when element (b T + i) T + j of head h's mask is."""
        if not drop:
            return att
        pr, seed = drop
        layer = dropout_site_seed(seed, (1 << 32) + l)
        keep = np.stack([dropout_keep(dropout_site_seed(layer, h), B * T * T, pr).reshape(B, T, T)
                         for h in range(NH)], axis=1)
        return att * torch.from_numpy(keep).float() * (1.0 / (1.0 - np.float32(pr)))

    def linear(x, name):
        y = x @ p[name + ".weight"] + p[name + ".bias"]
        if name in lora:
            a, b, s = lora[name]
            y = y + s * ((x @ a.T) @ b.T)
        return y

    x = dropout(p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:T], 0)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(L):
        g = lambda n: p[f"transformer.h.{l}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), 1e-5)
        qkv = linear(h, f"transformer.h.{l}.attn.c_attn")
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = attn_dropout(att.masked_fill(mask, float("-inf")).softmax(dim=-1), l)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + dropout(linear(y, f"transformer.h.{l}.attn.c_proj"), 1 + 2 * l)
        h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), 1e-5)
        h = F.gelu(linear(h, f"transformer.h.{l}.mlp.c_fc"), approximate="tanh")
        x = x + dropout(linear(h, f"transformer.h.{l}.mlp.c_proj"), 2 + 2 * l)
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    return x @ p["transformer.wte.weight"].T


def write_model(model_dir, p):
    """A Hugging Face GPT-2 directory (config.json + model.safetensors) of parameters p."""
    os.makedirs(model_dir)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), p)
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_head": NH, "n_embd": C,
           "n_positions": NCTX, "n_ctx": NCTX, "vocab_size": V, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    json.dump(cfg, open(os.path.join(model_dir, "config.json"), "w"))


# ---- the README's data contract -----------------------------------------------------------------------
def render_compact(instruction, inp):
    """README: the compact template, "{instruction}\\n{input}\\n=> " (no input line when input is empty)."""
    return instruction + "\n" + (inp + "\n" if inp else "") + "=> "


def stream_from_jsonl(path):
    """Token ids, and for each token the index of its record's first token if it is an answer token
    (scored only when that index is inside the row), True if it is always scored, False if never."""
    ids, score = [], []
    for line in open(path, encoding="utf-8"):
        if not line.strip():
            continue
        r = json.loads(line)
        start = len(ids)
        prompt = list(render_compact(r["instruction"], r.get("input", "")).encode())
        out = list(r["output"].encode()) + [EOT]
        ids += prompt + out
        score += [False] * len(prompt) + [start] * len(out)
    return ids, score


def stream_from_text(path):
    ids = list(open(path, "rb").read())
    return ids, [True] * len(ids)


def batch(ids, score, i, B, T):
    """Batch i with --shuffle off: B*T+1 tokens from i*B*T (wrapping), B rows of T+1. An answer token is a
    target only if its record started at or after the row's first token."""
    n = len(ids)
    x = torch.empty(B, T, dtype=torch.long)
    y = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        row = i * B * T + b * T  # unwrapped position of the row's first token
        for t in range(T):
            pos, nxt = (row + t) % n, (row + t + 1) % n
            x[b, t] = ids[pos]
            s = score[nxt]
            if s is True:
                ok = True
            elif s is False:
                ok = False
            else:  # the record starts at s; unwrap it into the row's coordinates
                rec = row + t + 1 - (nxt - s)
                ok = rec >= row
            y[b, t] = ids[nxt] if ok else -1
    return x, y


def lr_at(step, lr, warmup, total, min_frac, shape="cosine", decay_frac=0.2):
    """README: warmup, then cosine, linear or (wsd) constant and the last decay_frac of the steps along
    1 - sqrt, from lr at the first decaying step to lr * min_frac at the last."""
    if step < warmup:
        return lr * (step + 1) / warmup
    first = warmup
    if shape == "wsd":
        first = max(warmup, total - round(decay_frac * total))
        if step < first:
            return lr
    span = total - first
    ratio = min((step - first) / (span - 1), 1.0) if span > 1 else 1.0
    coeff = {"cosine": 0.5 * (1 + math.cos(math.pi * ratio)), "linear": 1 - ratio, "wsd": 1 - math.sqrt(ratio)}[shape]
    return lr * min_frac + coeff * (lr - lr * min_frac)


def step_loss(p, ids, score, step, B, T, accum, lora=None, drops=None):
    """drops: each micro-batch's (dropout probability, pass seed)."""
    micro = [batch(ids, score, step * accum + m, B, T) for m in range(accum)]
    count = sum(int((y >= 0).sum()) for _, y in micro)
    assert count > 0, f"step {step} has no target tokens: the scenario is misconfigured"
    total = 0
    for m, (x, y) in enumerate(micro):
        logits = forward(p, x, lora, drops[m] if drops else None)
        total = total + F.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=-1, reduction="sum")
    return total / count


def torch_adamw_losses(params, loss_at, steps, lr, warmup, wd, clip, group_decay=True, schedule=("cosine", 0.2)):
    """The losses of `steps` AdamW steps as anvil takes them: the schedule (shape, wsd's decay share), decay on matrices only
    (nanoGPT's grouping; every tensor with group_decay False), global-norm clipping. loss_at(step) -> loss."""
    params = list(params)
    if group_decay:
        groups = [{"params": [t for t in params if t.dim() >= 2], "weight_decay": wd},
                  {"params": [t for t in params if t.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": wd}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, lr, warmup, steps, 0.1, *schedule)
        opt.zero_grad()
        l = loss_at(s)
        l.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        losses.append(l.item())
    return losses


# ---- the checks ---------------------------------------------------------------------------------------
def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"FAILED: {' '.join(cmd)} exited {r.returncode}")
    return r.stdout


def scenario(tmp, name, data_path, stream, B, T, accum, steps=10, extra=(), schedule=("cosine", 0.2), dropout=0.0):
    """dropout: step 0 of a training pass with --dropout, its masks from the pass seeds anvil reports (the 10
    steps are not run: a step's seeds are anvil's own)."""
    failures = []
    model_dir = os.path.join(tmp, name + "_init")
    p = make_params()
    write_model(model_dir, p)
    ids, score = stream

    # 1. step 0: loss and every gradient
    gpath = os.path.join(tmp, name + "_grads.safetensors")
    env = dict(os.environ, ANVIL_DROPOUT=str(dropout)) if dropout else None
    run([GRAD_DUMP, model_dir, data_path, str(B), str(T), str(accum), gpath, *extra[1:]], env)
    grads, meta = read_safetensors(gpath)
    drops = [(dropout, int(s)) for s in meta["pass_seeds"].split(",")] if dropout else None
    loss = step_loss(p, ids, score, 0, B, T, accum, drops=drops)
    loss.backward()
    r = rel(float(meta["loss"]), loss.item())
    print(f"[{name}] step 0 loss: anvil {float(meta['loss']):.7f} torch {loss.item():.7f} rel {r:.2e}")
    if not r <= TOL:  # NaN never passes
        failures.append(f"{name}: step-0 loss differs by {r:.2e}")
    worst = 0.0
    for k, t in p.items():
        e = float((grads[k] - t.grad).norm() / t.grad.norm().clamp_min(1e-12))
        worst = max(worst, e)
        if not e <= TOL:
            failures.append(f"{name}: gradient of {k} differs by {e:.2e} (norm-relative)")
    print(f"[{name}] step 0 gradients: worst norm-relative error {worst:.2e} over {len(p)} tensors")
    if dropout:
        plain = step_loss({k: v.detach() for k, v in p.items()}, ids, score, 0, B, T, accum).item()
        if not rel(float(meta["loss"]), plain) > 10 * TOL:
            failures.append(f"{name}: the loss with dropout {dropout} is the loss without it ({plain:.7f})")
        return failures

    # 2. ten AdamW steps through `anvil train`
    lr, warmup, wd, clip = 1e-3, 3, 0.1, 1.0
    out = os.path.join(tmp, name + "_run")
    run([ANVIL, "train", "--init", model_dir, "--data", data_path, "--tokenizer", "byte", "--shuffle", "off",
         "--val-fraction", "0", "--batch", str(B), "--seq", str(T), "--grad-accum", str(accum), "--steps",
         str(steps), "--lr", str(lr), "--warmup", str(warmup), "--lr-schedule", schedule[0], "--decay-frac",
         str(schedule[1]), "--min-lr-frac", "0.1", "--weight-decay", str(wd), "--grad-clip", str(clip), "--log-every",
         "1", "--out", out, "--threads", "2", *extra])
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    anvil_losses = [r_["loss"] for r_ in records]
    lrs = [lr_at(s, lr, warmup, steps, 0.1, *schedule) for s in range(steps)]
    if not all(abs(r_["lr"] - x) <= 1e-6 * lr for r_, x in zip(records, lrs)):
        failures.append(f"{name}: {schedule[0]} learning rates {[r_['lr'] for r_ in records]}, expected {lrs}")
    p2 = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    torch_losses = torch_adamw_losses(p2.values(), lambda s: step_loss(p2, ids, score, s, B, T, accum), steps, lr,
                                      warmup, wd, clip, schedule=schedule)
    worst = max(rel(a, b) for a, b in zip(anvil_losses, torch_losses))
    print(f"[{name}] 10 AdamW steps ({schedule[0]} schedule): anvil {['%.5f' % x for x in anvil_losses]}")
    print(f"[{name}]                 torch {['%.5f' % x for x in torch_losses]}  worst rel {worst:.2e}")
    if len(anvil_losses) != steps:
        failures.append(f"{name}: anvil logged {len(anvil_losses)} steps, expected {steps}")
    if not worst <= TOL:
        failures.append(f"{name}: losses over 10 steps differ by up to {worst:.2e}")
    return failures


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        # plain text: every target in the loss
        text = os.path.join(tmp, "text.txt")
        rng = np.random.default_rng(7)
        words = ["the", "cat", "sat", "on", "a", "mat", "GPU", "tensor", "1234", "héllo", "\n", "  "]
        with open(text, "w", encoding="utf-8") as f:
            f.write(" ".join(rng.choice(words) for _ in range(1500)))
        failures += scenario(tmp, "text", text, stream_from_text(text), B=4, T=16, accum=2)
        failures += scenario(tmp, "dropout", text, stream_from_text(text), B=4, T=16, accum=2, dropout=0.2)
        # instruction records: prompt masked out of the loss by the template
        inst = os.path.join(tmp, "inst.jsonl")
        with open(inst, "w") as f:
            for i in range(200):
                a, b = int(rng.integers(0, 100)), int(rng.integers(0, 100))
                inp = f"{a}+{b}" if i % 3 else ""
                f.write(json.dumps({"instruction": "Add the numbers." if i % 3 else "Say hi.", "input": inp,
                                    "output": str(a + b) if i % 3 else "hi"}) + "\n")
        failures += scenario(tmp, "instruction", inst, stream_from_jsonl(inst), B=3, T=48, accum=2,
                             extra=("--template", "compact"), schedule=("wsd", 0.5))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: anvil agrees with the PyTorch oracle within 1e-4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
