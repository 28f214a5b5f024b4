#!/usr/bin/env python3
"""CPU training throughput: anvil against a PyTorch reference, same model, same machine, same threads.

Both train GPT-2 (default: 4 layers, width 256, 4 heads, context 128, batch 8, byte vocabulary of 257)
with AdamW on the same byte data for the same number of steps; the first --warmup steps are not timed.
`--arch llama` trains a Llama of the same width and depth instead (RMSNorm, rotary embeddings, SwiGLU MLP of
width 8/3 C rounded up to 64, --kv-heads key/value heads, untied head), and `--arch both` the two, so the cost
of the second family is measured against the first in each implementation. Shared machines are noisy, so the
runs alternate for --rounds rounds; each round's figure is its median step, and the result is the median over
rounds. Prints tokens/s of each and the ratios, and writes the result as JSON with --json PATH.

Run it with Debian's python3 (it has python3-torch):  make bench   or
  /usr/bin/python3 bench/cpu_train_bench.py --anvil build/anvil --threads 2 [--arch both]
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
    p.add_argument("--arch", choices=["gpt2", "llama", "both"], default="gpt2")
    p.add_argument("--kv-heads", type=int, default=2, help="Llama's key/value heads (grouped-query attention)")
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


def ffn_dim(a):
    return (8 * a.dim // 3 + 63) // 64 * 64  # anvil's default for --arch llama


def run_anvil(a, arch, data, out):
    steps = a.warmup + a.steps
    family = ["--arch", "llama", "--kv-heads", str(a.kv_heads), "--ffn-dim", str(ffn_dim(a))] if arch == "llama" else []
    cmd = [a.anvil, "train", *family, "--data", data, "--tokenizer", "byte", "--out", out, "--layers", str(a.layers),
           "--dim", str(a.dim), "--heads", str(a.heads), "--seq", str(a.seq), "--batch", str(a.batch),
           "--steps", str(steps), "--log-every", "1", "--val-fraction", "0", "--threads", str(a.threads),
           "--lr", "3e-4", "--warmup", "0", "--weight-decay", "0.1", "--grad-clip", "1.0"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    timed = [r["step_ms"] for r in rows if r["step"] > a.warmup]
    return a.batch * a.seq / (statistics.median(timed) / 1e3), rows[-1]["loss"]


def torch_llama(a, V):
    """Llama in plain PyTorch: RMSNorm, rotate_half rotary embeddings, SwiGLU, grouped-query attention."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    C, T, L, NH, KV, HS, FF = a.dim, a.seq, a.layers, a.heads, a.kv_heads, a.dim // a.heads, ffn_dim(a)
    inv = 1.0 / (10000.0 ** (torch.arange(0, HS, 2).float() / HS))
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):  # (B, H, T, HS)
        x1, x2 = x[..., : HS // 2], x[..., HS // 2:]
        return x * cos[: x.shape[2]] + torch.cat([-x2, x1], -1) * sin[: x.shape[2]]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q, self.k, self.v = (nn.Linear(C, n * HS, bias=False) for n in (NH, KV, KV))
            self.o = nn.Linear(C, C, bias=False)
            self.gate, self.up = nn.Linear(C, FF, bias=False), nn.Linear(C, FF, bias=False)
            self.down = nn.Linear(FF, C, bias=False)
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, x):
            B, Tn, _ = x.shape
            h = self.n1(x)
            q = rope(self.q(h).view(B, Tn, NH, HS).transpose(1, 2))
            k = rope(self.k(h).view(B, Tn, KV, HS).transpose(1, 2)).repeat_interleave(NH // KV, dim=1)
            v = self.v(h).view(B, Tn, KV, HS).transpose(1, 2).repeat_interleave(NH // KV, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
            att = att.masked_fill(self.mask[:Tn, :Tn], float("-inf")).softmax(dim=-1)
            x = x + self.o((att @ v).transpose(1, 2).reshape(B, Tn, C))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.head = nn.Linear(C, V, bias=False)

        def forward(self, idx, targets):
            x = self.embed(idx)
            for b in self.blocks:
                x = b(x)
            return F.cross_entropy(self.head(self.norm(x)).view(-1, V), targets.view(-1))

    return Llama()


def run_torch(a, arch, data):
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

    model = GPT() if arch == "gpt2" else torch_llama(a, V)
    n_params = sum(p.numel() for p in model.parameters())
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
    return B * T / statistics.median(times), loss.item(), torch.__version__, n_params


def main():
    a = parse()
    archs = ["gpt2", "llama"] if a.arch == "both" else [a.arch]
    runs = {(arch, impl): [] for arch in archs for impl in ("anvil", "torch")}
    losses, params = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        make_data(data)
        for r in range(a.rounds):
            for arch in archs:
                anvil_tps, losses[(arch, "anvil")] = run_anvil(a, arch, data, os.path.join(tmp, f"{arch}{r}"))
                torch_tps, losses[(arch, "torch")], torch_version, params[arch] = run_torch(a, arch, data)
                runs[(arch, "anvil")].append(anvil_tps)
                runs[(arch, "torch")].append(torch_tps)
                print(f"round {r + 1} {arch}: anvil {anvil_tps:.0f} tokens/s, PyTorch {torch_tps:.0f} tokens/s",
                      flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu = platform.processor() or ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    first = archs[0]
    result = {
        "config": {k: getattr(a, k) for k in ("layers", "dim", "heads", "seq", "batch", "steps", "warmup", "threads")},
        "vocab": 257, "cpu": cpu, "torch": torch_version,
        # the first architecture's figures at the top level, as before --arch existed
        "anvil_tokens_per_s": round(med[(first, "anvil")]), "torch_tokens_per_s": round(med[(first, "torch")]),
        "ratio": round(med[(first, "anvil")] / med[(first, "torch")], 3),
        "archs": {arch: {"params": params[arch],
                         "anvil_tokens_per_s": round(med[(arch, "anvil")]),
                         "torch_tokens_per_s": round(med[(arch, "torch")]),
                         "ratio": round(med[(arch, "anvil")] / med[(arch, "torch")], 3),
                         "rounds": {"anvil": [round(x) for x in runs[(arch, "anvil")]],
                                    "torch": [round(x) for x in runs[(arch, "torch")]]},
                         "final_loss": {"anvil": losses[(arch, "anvil")], "torch": losses[(arch, "torch")]}}
                  for arch in archs},
    }
    if "llama" in result["archs"]:
        result["archs"]["llama"]["kv_heads"] = a.kv_heads
        result["archs"]["llama"]["ffn_dim"] = ffn_dim(a)
    print(f"CPU: {cpu}, {a.threads} threads; {a.layers} layers, width {a.dim}, {a.heads} heads, seq {a.seq}, "
          f"batch {a.batch} (medians of {a.rounds} rounds, torch {torch_version})")
    for arch in archs:
        x = result["archs"][arch]
        print(f"{arch:6s} ({x['params'] / 1e6:.2f}M params)  anvil {x['anvil_tokens_per_s']:8d}  PyTorch "
              f"{x['torch_tokens_per_s']:8d} tokens/s  ratio {x['ratio']:.2f}x")
    if len(archs) == 2:
        print(f"llama / gpt2 tokens/s: anvil {med[('llama', 'anvil')] / med[('gpt2', 'anvil')]:.2f}, "
              f"PyTorch {med[('llama', 'torch')] / med[('gpt2', 'torch')]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
