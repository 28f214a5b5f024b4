#!/usr/bin/env python3
"""anvil's own PyTorch 2.x reference for GPU training speed: GPT-2 with PyTorch's fastest plain recipe.

torch.compile, scaled_dot_product_attention (flash attention), fused AdamW, bf16 autocast with fp32 master
weights, TF32 allowed for whatever stays in fp32. It reads the same shard as anvil (an anvil-shards token file)
in the same order (batch i is the window of B*T+1 tokens at token i*B*T, wrapping, cut into B rows), so the two
runs see the same tokens and their losses can be compared too. Prints one JSON line.

  python3 bench/torch_gpt_reference.py --shard DATA/train_000000.bin --batch 16 --seq 1024
"""
import argparse
import json
import math
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shard", required=True, help="an anvil-shards token file (64-byte header, then ids)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--no-compile", action="store_true")
    return p.parse_args()


def read_shard(path):
    head = np.fromfile(path, dtype=np.uint8, count=64)
    assert bytes(head[:8]) == b"ANVILTOK", f"{path}: not an anvil shard"
    width = int(np.frombuffer(head[12:16].tobytes(), "<u4")[0])
    count = int(np.frombuffer(head[24:32].tobytes(), "<u8")[0])
    return np.memmap(path, dtype="<u2" if width == 2 else "<u4", mode="r", offset=64, shape=(count,))


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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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


def main():
    a = parse()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    tokens = read_shard(a.shard)
    model = GPT(a.layers, a.heads, a.dim, a.seq, a.vocab).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = model if a.no_compile else torch.compile(model)
    B, T = a.batch, a.seq
    window = B * T + 1
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        start = (step * B * T) % len(tokens)
        chunk = np.take(tokens, np.arange(start, start + window), mode="wrap").astype(np.int64)
        buf = torch.from_numpy(chunk).pin_memory().to(dev, non_blocking=True)
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the step's one host synchronisation, as anvil's logging
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    step_s = statistics.median(times)
    print(json.dumps({
        "impl": "torch-reference", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "compile": not a.no_compile, "params": n_params, "batch": B, "seq": T,
        "step_ms_median": round(step_s * 1e3, 2), "tokens_per_s": round(B * T / step_s),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "losses": [round(x, 4) for x in losses]}))


if __name__ == "__main__":
    main()
