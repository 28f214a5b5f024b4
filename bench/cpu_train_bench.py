#!/usr/bin/env python3
"""CPU training throughput: anvil against a PyTorch reference, same model, same machine, same threads.

Both train GPT-2 (default: 4 layers, width 256, 4 heads, context 128, batch 8, byte vocabulary of 257)
with AdamW on the same byte data for the same number of steps; the first --warmup steps are not timed.
Shared machines are noisy, so the two alternate for --rounds rounds; each round's figure is its median
step, and the result is the median over rounds. Prints tokens/s of each and their ratio, and writes the
result as JSON with --json PATH.

Run it with Debian's python3 (it has python3-torch):  make bench   or
  /usr/bin/python3 bench/cpu_train_bench.py --anvil build/anvil --threads 2
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anvil", default="build/anvil", help="path to the anvil binary")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rounds", type=int, default=3, help="alternating anvil/PyTorch rounds")
    p.add_argument("--json", help="write the result here")
    return p.parse_args()


def make_data(path, n_bytes=400_000):
    import random
    rng = random.Random(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "GPU", "tensor", "42", "\n"]
    with open(path, "w") as f:
        n = 0
        while n < n_bytes:
            w = rng.choice(words) + " "
            f.write(w)
            n += len(w)


def run_anvil(a, data, out):
    steps = a.warmup + a.steps
    cmd = [a.anvil, "train", "--data", data, "--tokenizer", "byte", "--out", out, "--layers", str(a.layers),
           "--dim", str(a.dim), "--heads", str(a.heads), "--seq", str(a.seq), "--batch", str(a.batch),
           "--steps", str(steps), "--log-every", "1", "--val-fraction", "0", "--threads", str(a.threads),
           "--lr", "3e-4", "--warmup", "0", "--weight-decay", "0.1", "--grad-clip", "1.0"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    timed = [r["step_ms"] for r in rows if r["step"] > a.warmup]
    return a.batch * a.seq / (statistics.median(timed) / 1e3), rows[-1]["loss"]


def run_torch(a, data):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    V, C, T, L, NH = 257, a.dim, a.seq, a.layers, a.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, x):
            B, Tn, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, Tn, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))
            att = att.masked_fill(self.mask[:Tn, :Tn], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, Tn, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    tokens = torch.tensor(list(open(data, "rb").read()), dtype=torch.long)
    B = a.batch
    times, loss = [], None
    for step in range(a.warmup + a.steps):
        i = step * B * T
        chunk = tokens[i % (len(tokens) - B * T - 1):][: B * T + 1]
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    return B * T / statistics.median(times), loss.item(), torch.__version__


def main():
    a = parse()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        make_data(data)
        anvil_runs, torch_runs = [], []
        for r in range(a.rounds):
            anvil_tps, anvil_loss = run_anvil(a, data, os.path.join(tmp, f"run{r}"))
            torch_tps, torch_loss, torch_version = run_torch(a, data)
            anvil_runs.append(anvil_tps)
            torch_runs.append(torch_tps)
            print(f"round {r + 1}: anvil {anvil_tps:.0f} tokens/s, PyTorch {torch_tps:.0f} tokens/s", flush=True)
        anvil_tps, torch_tps = statistics.median(anvil_runs), statistics.median(torch_runs)
    cpu = platform.processor() or ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    result = {
        "config": {k: getattr(a, k) for k in ("layers", "dim", "heads", "seq", "batch", "steps", "warmup", "threads")},
        "vocab": 257, "cpu": cpu, "torch": torch_version,
        "anvil_tokens_per_s": round(anvil_tps), "torch_tokens_per_s": round(torch_tps),
        "rounds": {"anvil": [round(x) for x in anvil_runs], "torch": [round(x) for x in torch_runs]},
        "ratio": round(anvil_tps / torch_tps, 3),
        "final_loss": {"anvil": anvil_loss, "torch": torch_loss},
    }
    print(f"CPU: {cpu}, {a.threads} threads; model {a.layers}L/{a.dim}/{a.heads}H, seq {a.seq}, batch {a.batch}")
    print(f"anvil    {anvil_tps:10.0f} tokens/s (median of {a.rounds} rounds)")
    print(f"PyTorch  {torch_tps:10.0f} tokens/s (median of {a.rounds} rounds, torch {torch_version})")
    print(f"ratio    {anvil_tps / torch_tps:10.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
