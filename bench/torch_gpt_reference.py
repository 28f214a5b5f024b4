#!/usr/bin/env python3
"""anvil's own PyTorch 2.x reference for GPU training: GPT-2 (or, with --arch llama, a Llama: RMSNorm, rotary
positions, grouped-query attention, SwiGLU, an untied head, as anvil's --arch llama) with PyTorch's fastest
plain recipe.

torch.compile, scaled_dot_product_attention (flash attention), fused AdamW, bf16 autocast with fp32 master
weights, TF32 allowed for whatever stays in fp32. It reads the same tokens as anvil in the same order as
`anvil train --shuffle off` (batch i is the window of B*T+1 tokens at token i*B*T of the training split,
wrapping, cut into B rows; micro-batch m of step s is batch s*A+m), so the two runs' losses can be compared
step by step. Prints one JSON line.

Speed (what bench/gpu_train_bench.py runs):
  python3 bench/torch_gpt_reference.py --shard DATA/train_000000.bin --batch 16 --seq 1024
Loss against anvil from the same weights (what bench/loss_match.py runs):
  python3 bench/torch_gpt_reference.py --save-init INIT --layers 12 ...   # a Hugging Face GPT-2 directory
  python3 bench/torch_gpt_reference.py --init INIT --data DATA --warmup 0 --steps 500 --lr-warmup 50 \\
      --lr-schedule cosine --metrics torch/metrics.jsonl
where DATA is an `anvil data prepare` directory; both then train from INIT with anvil's hyperparameters
(AdamW betas 0.9/0.95, eps 1e-8, weight decay on matrices only, global-norm clipping, linear warmup then a
cosine down to --min-lr-frac of --lr, anvil's schedule). --device cpu --dtype fp32 --no-compile runs the
same on the CPU with the PyTorch 1.13 Debian ships (plain attention where SDPA is missing).
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shard", help="an anvil-shards token file (64-byte header, then ids)")
    p.add_argument("--data", help="an `anvil data prepare` directory: its training split, in order")
    p.add_argument("--init", help="start from this Hugging Face GPT-2 directory (model.safetensors, F32)")
    p.add_argument("--save-init", help="write the seeded initial model there as a Hugging Face GPT-2 "
                   "directory and exit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    p.add_argument("--ffn-dim", type=int, default=0, help="llama: MLP width (0: 8/3 of --dim up to a multiple of "
                   "64, anvil's default)")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="llama: rotary base")
    p.add_argument("--norm-eps", type=float, default=1e-6, help="llama: RMSNorm epsilon")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--lr-warmup", type=int, default=0, help="linear learning-rate warmup steps")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="autocast dtype (fp32: none)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, this many more under torch.profiler (CUDA only): each kernel's "
                        "time a step, to --profile-out (default: standard error)")
    p.add_argument("--profile-out", help="where --profile-steps's table goes (a .json file gets JSON rows too)")
    p.add_argument("--metrics", help="also write each step's loss and learning rate there, as JSON lines "
                   "(step counted from 1, as anvil's metrics.jsonl)")
    return p.parse_args()


def read_shard(path):
    head = np.fromfile(path, dtype=np.uint8, count=64)
    assert bytes(head[:8]) == b"ANVILTOK", f"{path}: not an anvil shard"
    width, _, has_flags = (int(x) for x in np.frombuffer(head[12:24].tobytes(), "<u4"))
    assert not has_flags, f"{path}: has per-token loss flags (instruction data); give plain text"
    count = int(np.frombuffer(head[24:32].tobytes(), "<u8")[0])
    return np.memmap(path, dtype="<u2" if width == 2 else "<u4", mode="r", offset=64, shape=(count,))


def read_tokens(a):
    if a.shard:
        return read_shard(a.shard)
    meta = json.load(open(os.path.join(a.data, "meta.json")))
    parts = [read_shard(os.path.join(a.data, f)) for f in meta["splits"]["train"]["files"]]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).view(B, T, 3, self.NH, C // self.NH).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2 initialisation, as anvil's
            if p.dim() >= 2:
                proj = name.endswith("attn_proj.weight") or name.endswith("c_proj.weight")
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * L) if proj else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def causal_attention(q, k, v):
    """q (B, NH, T, hs), k and v (B, KVH, T, hs), KVH dividing NH: softmax(q k^T / sqrt(hs), causal) v."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key/value head serves NH / KVH query heads
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]  # PyTorch 1.x
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in f32 (as Hugging Face's LlamaRMSNorm)."""
    def __init__(self, C, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(C))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x, cos, sin):
    """Rotary positions, Hugging Face's layout: the head's first half paired with its second."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, KVH, ffn, eps):
        super().__init__()
        self.NH, self.KVH, self.hs = NH, KVH, C // NH
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C, eps), RMSNorm(C, eps)
        self.q_proj = nn.Linear(C, C, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(C, KVH * self.hs, bias=False) for _ in range(2))
        self.o_proj = nn.Linear(C, C, bias=False)
        self.gate_proj, self.up_proj = (nn.Linear(C, ffn, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(ffn, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.NH, self.hs).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.KVH, self.hs).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.KVH, self.hs).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # (bf16 under autocast, as the projections)
        y = causal_attention(rotate(q, cos, sin), rotate(k, cos, sin), v)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, NH, KVH, C, ffn, V, theta, eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(LlamaBlock(C, NH, KVH, ffn, eps) for _ in range(L))
        self.norm = RMSNorm(C, eps)
        self.lm_head = nn.Linear(C, V, bias=False)
        hs = C // NH
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs),
                             persistent=False)
        for p in self.parameters():  # anvil's initialisation: every matrix N(0, 0.02), the norms ones
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        freqs = torch.outer(torch.arange(T, device=idx.device, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(idx)
        for b in self.layers:
            x = b(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def llama_ffn(a):
    return a.ffn_dim or (8 * a.dim // 3 + 63) // 64 * 64


def make_model(a):
    if a.arch == "llama":
        return Llama(a.layers, a.heads, a.kv_heads or a.heads, a.dim, llama_ffn(a), a.vocab, a.rope_theta, a.norm_eps)
    return GPT(a.layers, a.heads, a.dim, a.seq, a.vocab)


# ---- Hugging Face GPT-2 layout: names, and Conv1D weights stored (in, out) ------------------------------
HF_NAMES = {"ln_1": "ln_1", "ln_2": "ln_2", "c_attn": "attn.c_attn", "attn_proj": "attn.c_proj",
            "c_fc": "mlp.c_fc", "c_proj": "mlp.c_proj"}


def hf_name(name):
    """This module's parameter name -> (Hugging Face name, transposed?)."""
    if not name.startswith(("h.", "wte", "wpe", "ln_f")):  # a Llama: Hugging Face's names and layout but for
        parts = name.split(".")                             # the blocks' grouping
        if parts[0] == "layers":
            group = "self_attn" if parts[2].endswith("_proj") and parts[2][0] in "qkvo" else "mlp"
            if parts[2].endswith("layernorm"):
                return f"model.layers.{parts[1]}.{parts[2]}.{parts[3]}", False
            return f"model.layers.{parts[1]}.{group}.{parts[2]}.{parts[3]}", False
        return (name if name.startswith("lm_head") else "model." + name), False
    parts = name.split(".")
    if parts[0] == "h":
        hf = f"transformer.h.{parts[1]}.{HF_NAMES[parts[2]]}.{parts[3]}"
        return hf, parts[2] not in ("ln_1", "ln_2") and parts[3] == "weight"
    return "transformer." + name, False


def save_hf(model, a, path):
    os.makedirs(path, exist_ok=True)
    header, blobs, offset = {}, [], 0
    for name, p in model.named_parameters():
        key, transposed = hf_name(name)
        arr = (p.detach().t() if transposed else p.detach()).contiguous().cpu().float().numpy()
        header[key] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        blobs.append(arr.tobytes())
        offset += arr.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)
    if a.arch == "llama":
        config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": a.layers,
                  "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads or a.heads,
                  "hidden_size": a.dim, "intermediate_size": llama_ffn(a), "max_position_embeddings": a.seq,
                  "vocab_size": a.vocab, "rms_norm_eps": a.norm_eps, "rope_theta": a.rope_theta,
                  "hidden_act": "silu", "tie_word_embeddings": False}
    else:
        config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": a.layers,
                  "n_head": a.heads, "n_embd": a.dim, "n_positions": a.seq, "n_ctx": a.seq, "vocab_size": a.vocab,
                  "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def load_hf(model, path):
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = memoryview(raw)[8 + n:]
    with torch.no_grad():
        for name, p in model.named_parameters():
            key, transposed = hf_name(name)
            e = header[key]
            assert e["dtype"] == "F32", f"{path}: {key} is {e['dtype']}; this reference reads F32"
            b, end = e["data_offsets"]
            t = torch.from_numpy(np.frombuffer(body[b:end], dtype=np.float32).reshape(e["shape"]).copy())
            p.copy_(t.t() if transposed else t)


def lr_at(a, step):
    """anvil's schedule (train/schedule.h): linear warmup, then constant or a cosine to min_lr_frac * lr."""
    total = a.warmup + a.steps
    if step < a.lr_warmup:
        return a.lr * (step + 1) / a.lr_warmup
    if a.lr_schedule == "constant":
        return a.lr
    span = total - a.lr_warmup
    ratio = min((step - a.lr_warmup) / (span - 1), 1.0) if span > 1 else 1.0
    low = a.lr * a.min_lr_frac
    return low + 0.5 * (1 + math.cos(math.pi * ratio)) * (a.lr - low)


def main():
    a = parse()
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = make_model(a)
    if a.save_init:
        save_hf(model, a, a.save_init)
        print(json.dumps({"saved": a.save_init, "params": sum(p.numel() for p in model.parameters())}))
        return
    assert a.shard or a.data, "give --shard FILE or --data DIR"
    if a.init:
        load_hf(model, a.init)
    dev = a.device
    cuda = dev.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    tokens = read_tokens(a)
    model = model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    extra = {"fused": True} if cuda else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
    compiled = not a.no_compile and hasattr(torch, "compile")  # PyTorch 1.x has no compiler
    fwd = torch.compile(model) if compiled else model
    B, T, A = a.batch, a.seq, a.grad_accum
    window = B * T + 1
    times, losses, rows = [], [], []
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def one_step(step, record=True):  # record: the step's loss and time count (not the profiled ones)
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        sync()
        t0 = time.perf_counter()
        total = 0.0
        for m in range(A):
            start = ((step * A + m) * B * T) % len(tokens)
            chunk = np.take(tokens, np.arange(start, start + window), mode="wrap").astype(np.int64)
            buf = torch.from_numpy(chunk)
            buf = buf.pin_memory().to(dev, non_blocking=True) if cuda else buf
            x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
            if a.dtype == "bf16":
                with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16):
                    loss = fwd(x, y)
            else:
                loss = fwd(x, y)
            (loss / A).backward()
            total = total + loss.detach()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_loss = (total / A).item()  # the step's one host synchronisation, as anvil's logging
        dt = time.perf_counter() - t0
        if not record:
            return
        losses.append(step_loss)
        if step >= a.warmup:
            times.append(dt)
        rows.append({"step": step + 1, "loss": step_loss, "lr": lr, "step_ms": dt * 1e3, "tokens_per_s": B * T * A / dt})

    for step in range(a.warmup + a.steps):
        one_step(step)
    if a.profile_steps > 0 and cuda:
        profile(a, lambda i: one_step(a.warmup + a.steps + i, record=False), B * T * A)
    if a.metrics:
        os.makedirs(os.path.dirname(os.path.abspath(a.metrics)), exist_ok=True)
        with open(a.metrics, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    step_s = statistics.median(times) if times else float("nan")
    print(json.dumps({
        "impl": "torch-reference", "arch": a.arch, "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "compile": compiled, "dtype": a.dtype,
        "params": n_params, "batch": B, "seq": T, "grad_accum": A,
        "step_ms_median": round(step_s * 1e3, 2), "tokens_per_s": round(B * T * A / step_s) if times else 0,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else 0,
        "losses": [round(x, 4) for x in losses]}))


def profile(a, step_fn, tokens_per_step):
    """Runs a.profile_steps steps under torch.profiler; writes each CUDA kernel's time a step, largest first."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(a.profile_steps):
            step_fn(i)
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        t = e.time_range.elapsed_us() if e.device_type == torch.autograd.DeviceType.CUDA else 0
        if t:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += t / 1e3 / a.profile_steps  # ms a step
            k[1] += 1
    total = sum(v[0] for v in kernels.values())
    rows = sorted(({"kernel": n, "ms_per_step": round(v[0], 4), "share": v[0] / total if total else 0.0,
                    "launches_per_step": v[1] // a.profile_steps} for n, v in kernels.items()),
                  key=lambda r: -r["ms_per_step"])
    lines = [f"torch.profiler: {a.profile_steps} steps of {tokens_per_step} tokens, {total:.2f} ms of kernels a "
             f"step, {sum(r['launches_per_step'] for r in rows)} launches a step",
             f"{'kernel':70} {'ms/step':>8} {'share':>6} {'calls':>6}"]
    lines += [f"{r['kernel'][:70]:70} {r['ms_per_step']:8.3f} {100 * r['share']:5.1f}% {r['launches_per_step']:6}"
              for r in rows[:40]]
    text = "\n".join(lines) + "\n"
    if a.profile_out:
        with open(a.profile_out, "w") as f:
            if a.profile_out.endswith(".json"):
                json.dump({"kernel_ms_per_step": total, "kernels": rows}, f, indent=1)
            else:
                f.write(text)
    sys.stderr.write(text)


if __name__ == "__main__":
    main()
