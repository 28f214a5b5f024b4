#!/usr/bin/env python3
"""CPU training throughput: anvil against a PyTorch reference, same model, same machine, same threads.

Both train GPT-2 (default: 4 layers, width 256, 4 heads, context 128, batch 8, byte vocabulary of 257)
with AdamW on the same byte data for the same number of steps; the first --warmup steps are not timed.
`--arch llama` trains a Llama of the same width and depth instead (RMSNorm, rotary embeddings, SwiGLU MLP of
width 8/3 C rounded up to 64, --kv-heads key/value heads, untied head), and `--arch both` the two, so the cost
of the second family is measured against the first in each implementation. Shared machines are noisy, so the
runs alternate for --rounds rounds; each round's figure is its median step, and the result is the median over
rounds. Prints tokens/s of each and the ratios, and writes the result as JSON with --json PATH.

`--recompute off,full` (any of off, selective, full) trains each listed mode: anvil with `--recompute MODE`,
PyTorch with every block under torch.utils.checkpoint for full (PyTorch has no counterpart of anvil's
selective mode; it runs only in anvil). Each run is then its own process and its peak resident memory is
reported beside its speed (anvil's also as the backend's peak allocation).

Run it with Debian's python3 (it has python3-torch):  make bench   or
  /usr/bin/python3 bench/cpu_train_bench.py --anvil build/anvil --threads 2 [--arch both]
"""
import argparse
import contextlib
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
    p.add_argument("--recompute", default="off",
                   help="comma-separated modes to train in (off, selective, full): activation memory for compute")
    p.add_argument("--precision", default="fp32",
                   help="fp32, bf16 or both (fp32,bf16), alternated within each round: bf16 is anvil's "
                        "--precision bf16 (bf16 products through oneDNN) against PyTorch's CPU autocast to bf16")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--torch-worker", help=argparse.SUPPRESS)  # ARCH,MODE,DATA: one PyTorch run, JSON on stdout
    a = p.parse_args()
    for m in a.recompute.split(","):
        if m not in ("off", "selective", "full"):
            p.error(f"--recompute: {m!r} is not off, selective or full")
    for x in a.precision.split(","):
        if x not in ("fp32", "bf16"):
            p.error(f"--precision: {x!r} is not fp32 or bf16")
    # a mode: the recompute mode, with "+bf16" for bf16 products
    a.modes = [m + ("" if x == "fp32" else "+" + x) for x in a.precision.split(",") for m in a.recompute.split(",")]
    return a


def split_mode(mode):
    """A mode's (recompute, precision): "full+bf16" -> ("full", "bf16")."""
    rec, _, prec = mode.partition("+")
    return rec, prec or "fp32"


def measured(cmd):
    """Runs cmd; its stdout and its peak resident set size in MiB."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
    return out, usage.ru_maxrss / 1024


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


def run_anvil(a, arch, data, out, mode="off"):
    steps = a.warmup + a.steps
    mode, precision = split_mode(mode)
    family = ["--arch", "llama", "--kv-heads", str(a.kv_heads), "--ffn-dim", str(ffn_dim(a))] if arch == "llama" else []
    cmd = [a.anvil, "train", *family, "--data", data, "--tokenizer", "byte", "--out", out, "--layers", str(a.layers),
           "--dim", str(a.dim), "--heads", str(a.heads), "--seq", str(a.seq), "--batch", str(a.batch),
           "--steps", str(steps), "--log-every", "1", "--val-fraction", "0", "--threads", str(a.threads),
           "--lr", "3e-4", "--warmup", "0", "--weight-decay", "0.1", "--grad-clip", "1.0", "--recompute", mode,
           "--device", "cpu", "--precision", precision]
    _, rss = measured(cmd)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    timed = [r["step_ms"] for r in rows if r["step"] > a.warmup]
    return {"tokens_per_s": a.batch * a.seq / (statistics.median(timed) / 1e3), "loss": rows[-1]["loss"],
            "peak_rss_mb": rss, "peak_alloc_mb": max(r.get("peak_mem_mb", 0) for r in rows)}


def torch_llama(a, V, run_block):
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
                x = run_block(b, x)
            return F.cross_entropy(self.head(self.norm(x)).view(-1, V), targets.view(-1))

    return Llama()


def run_torch(a, arch, data, mode="off"):
    """One PyTorch run in a process of its own (so its peak memory is its own)."""
    out, rss = measured([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--torch-worker",
                         f"{arch},{mode},{data}"])
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_mb"] = rss
    return r


def torch_worker(a):
    arch, mode, data = a.torch_worker.split(",", 2)
    mode, precision = split_mode(mode)
    import torch
    import torch.utils.checkpoint
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
                x = run_block(b, x)
            logits = self.ln_f(x) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    def run_block(b, x):
        if mode == "full":  # activation checkpointing: keep the block's input, run it again in the backward
            return torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
        return b(x)

    model = GPT() if arch == "gpt2" else torch_llama(a, V, run_block)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    tokens = torch.tensor(list(open(data, "rb").read()), dtype=torch.long)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    B = a.batch
    times, loss = [], None
    for step in range(a.warmup + a.steps):
        i = step * B * T
        chunk = tokens[i % (len(tokens) - B * T - 1):][: B * T + 1]
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    print(json.dumps({"tokens_per_s": B * T / statistics.median(times), "loss": loss.item(),
                      "torch": torch.__version__, "params": n_params}))
    return 0


def key(arch, impl, mode):
    return f"{arch}/{impl}" + ("" if mode == "off" else f"/recompute-{mode}")


def main():
    a = parse()
    if a.torch_worker:
        return torch_worker(a)
    archs = ["gpt2", "llama"] if a.arch == "both" else [a.arch]
    plan = [(arch, impl, mode) for arch in archs for mode in a.modes for impl in ("anvil", "torch")
            if not (impl == "torch" and split_mode(mode)[0] == "selective")]
    runs = {key(*p): [] for p in plan}
    last, params, torch_version = {}, {}, None
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        make_data(data)
        for r in range(a.rounds):
            for arch, impl, mode in plan:
                k = key(arch, impl, mode)
                if impl == "anvil":
                    res = run_anvil(a, arch, data, os.path.join(tmp, f"{arch}-{mode}-{r}"), mode)
                else:
                    res = run_torch(a, arch, data, mode)
                    torch_version, params[arch] = res["torch"], res["params"]
                runs[k].append(res["tokens_per_s"])
                last[k] = res
                print(f"round {r + 1} {k}: {res['tokens_per_s']:.0f} tokens/s, peak RSS {res['peak_rss_mb']:.0f} MiB",
                      flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu = platform.processor() or ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    first, m0 = archs[0], a.modes[0]
    result = {
        "config": {k: getattr(a, k)
                   for k in ("layers", "dim", "heads", "seq", "batch", "steps", "warmup", "threads", "precision")},
        "vocab": 257, "cpu": cpu, "torch": torch_version,
        "command": " ".join(["/usr/bin/python3", "bench/cpu_train_bench.py", *sys.argv[1:]]),
        # the first architecture's (and mode's) figures at the top level, as before --arch existed
        "anvil_tokens_per_s": round(med[key(first, "anvil", m0)]),
        "torch_tokens_per_s": round(med[key(first, "torch", m0)]) if key(first, "torch", m0) in med else None,
        "archs": {},
    }
    if result["torch_tokens_per_s"]:
        result["ratio"] = round(result["anvil_tokens_per_s"] / result["torch_tokens_per_s"], 3)
    for arch in archs:
        x = result["archs"][arch] = {"params": params[arch]}
        for mode in a.modes:
            for impl in ("anvil", "torch"):
                k = key(arch, impl, mode)
                if k in med:
                    x.setdefault(mode, {})[impl] = {
                        "tokens_per_s": round(med[k]), "rounds": [round(v) for v in runs[k]],
                        "final_loss": last[k]["loss"], "peak_rss_mb": round(last[k]["peak_rss_mb"]),
                        **({"peak_alloc_mb": round(last[k]["peak_alloc_mb"])} if impl == "anvil" else {})}
            y = x[mode]
            if "torch" in y:
                y["ratio"] = round(y["anvil"]["tokens_per_s"] / y["torch"]["tokens_per_s"], 3)
        if "off" in a.modes:  # as before --recompute existed
            x.update({"anvil_tokens_per_s": x["off"]["anvil"]["tokens_per_s"],
                      "torch_tokens_per_s": x["off"]["torch"]["tokens_per_s"], "ratio": x["off"]["ratio"]})
    if "llama" in result["archs"]:
        result["archs"]["llama"]["kv_heads"] = a.kv_heads
        result["archs"]["llama"]["ffn_dim"] = ffn_dim(a)
    print(f"CPU: {cpu}, {a.threads} threads; {a.layers} layers, width {a.dim}, {a.heads} heads, seq {a.seq}, "
          f"batch {a.batch} (medians of {a.rounds} rounds, torch {torch_version})")
    for arch in archs:
        x = result["archs"][arch]
        for mode in a.modes:
            y = x[mode]
            line = (f"{arch:6s} ({x['params'] / 1e6:.2f}M params) recompute {mode:9s} anvil "
                    f"{y['anvil']['tokens_per_s']:7d} tokens/s, {y['anvil']['peak_rss_mb']:6d} MiB RSS")
            if "torch" in y:
                line += (f" | PyTorch {y['torch']['tokens_per_s']:7d} tokens/s, {y['torch']['peak_rss_mb']:6d} MiB RSS"
                         f" | ratio {y['ratio']:.2f}x")
            print(line)
    if len(archs) == 2:
        print(f"llama / gpt2 tokens/s: anvil {med[key('llama', 'anvil', m0)] / med[key('gpt2', 'anvil', m0)]:.2f}, "
              f"PyTorch {med[key('llama', 'torch', m0)] / med[key('gpt2', 'torch', m0)]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
