#!/usr/bin/env python3
"""Oracle test for the Llama family: an independent Llama in PyTorch (Debian's python3-torch; RMSNorm, rotary
embeddings in transformers' rotate_half layout with Llama 3.1's rope_scaling, grouped-query attention through
repeat_kv, a SwiGLU MLP, an untied or tied head), written here from the architecture's definition, against
anvil on the same Hugging Face-layout checkpoint and the same batches.

The checkpoint is written the way transformers shards one: model-00001-of-00002.safetensors (F32) and
model-00002-of-00002.safetensors (BF16, values already representable) with model.safetensors.index.json.

  1. step 0: the loss and every gradient (anvil_grad_dump), within 1e-5 relative (gradients: per tensor, in norm);
  2. `anvil train --init DIR` for 10 AdamW steps, every loss within 1e-4 relative;
  3. the same two checks for a LoRA run on it (PEFT's names, fan_in_fan_out false, all seven projections);
  4. the relatives in the same layout: Qwen2 (model_type qwen2, biases on q, k and v; also with LoRA), Llama
     with attention_bias and mlp_bias (biases on all seven projections), and Mistral whose sliding_window is
     shorter than max_position_embeddings (anvil runs it with the window as its context; the sequences here
     fill the window, where sliding-window attention is plain causal attention).

Skips (exit 77) without torch.
"""
import json
import math
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import test_torch_oracle as o  # noqa: E402  (skips with exit 77 when torch is missing)

torch, np, F = o.torch, o.np, o.F
TOL_GRAD, TOL_STEPS = 1e-5, 1e-4
V = o.V
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Cfg:
    """kind: llama (bias: attention_bias and mlp_bias), qwen2 (biases on q, k, v) or mistral (window: a
    sliding_window shorter than NCTX)."""

    def __init__(self, L=2, NH=4, KVH=2, C=32, FF=80, NCTX=64, theta=10000.0, eps=1e-6, tied=False, scaling=None,
                 kind="llama", bias=False, window=None):
        self.L, self.NH, self.KVH, self.C, self.FF, self.NCTX = L, NH, KVH, C, FF, NCTX
        self.HS = C // NH
        self.theta, self.eps, self.tied, self.scaling = theta, eps, tied, scaling
        self.kind, self.window = kind, window
        self.qkv_bias = kind == "qwen2" or bias
        self.o_bias = self.mlp_bias = bias

    def hf(self):
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[self.kind]
        j = {"model_type": self.kind, "architectures": [arch], "hidden_size": self.C,
             "intermediate_size": self.FF, "num_hidden_layers": self.L, "num_attention_heads": self.NH,
             "num_key_value_heads": self.KVH, "max_position_embeddings": self.NCTX, "rms_norm_eps": self.eps,
             "rope_theta": self.theta, "rope_scaling": self.scaling, "vocab_size": V,
             "tie_word_embeddings": self.tied, "hidden_act": "silu", "anvil_tokenizer": "byte"}
        if self.kind == "llama":
            j["attention_bias"] = j["mlp_bias"] = self.o_bias
        elif self.kind == "qwen2":
            j.update({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": self.L})
        else:
            j["sliding_window"] = self.window
        return j


def shapes(c):
    s = {"model.embed_tokens.weight": (V, c.C), "model.norm.weight": (c.C,)}
    for l in range(c.L):
        h = f"model.layers.{l}."
        s[h + "input_layernorm.weight"] = (c.C,)
        s[h + "post_attention_layernorm.weight"] = (c.C,)
        s[h + "self_attn.q_proj.weight"] = (c.NH * c.HS, c.C)
        s[h + "self_attn.k_proj.weight"] = (c.KVH * c.HS, c.C)
        s[h + "self_attn.v_proj.weight"] = (c.KVH * c.HS, c.C)
        s[h + "self_attn.o_proj.weight"] = (c.C, c.NH * c.HS)
        s[h + "mlp.gate_proj.weight"] = (c.FF, c.C)
        s[h + "mlp.up_proj.weight"] = (c.FF, c.C)
        s[h + "mlp.down_proj.weight"] = (c.C, c.FF)
        if c.qkv_bias:
            s[h + "self_attn.q_proj.bias"] = (c.NH * c.HS,)
            s[h + "self_attn.k_proj.bias"] = (c.KVH * c.HS,)
            s[h + "self_attn.v_proj.bias"] = (c.KVH * c.HS,)
        if c.o_bias:
            s[h + "self_attn.o_proj.bias"] = (c.C,)
        if c.mlp_bias:
            s[h + "mlp.gate_proj.bias"] = (c.FF,)
            s[h + "mlp.up_proj.bias"] = (c.FF,)
            s[h + "mlp.down_proj.bias"] = (c.C,)
    if not c.tied:
        s["lm_head.weight"] = (V, c.C)
    return s


def make_params(c):
    p = {}
    for k, sh in shapes(c).items():
        t = 1 + 0.1 * torch.randn(sh) if k.endswith("norm.weight") else 0.1 * torch.randn(sh)
        p[k] = t.bfloat16().float()  # representable in BF16: the second shard is written as BF16
    return {k: v.requires_grad_(True) for k, v in p.items()}


def write_st(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().contiguous().numpy().astype(np.float32)
        if dtype == "BF16":
            a = (a.view(np.uint32) >> 16).astype(np.uint16)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_model(d, c, p):
    os.makedirs(d)
    names = list(p)
    half = len(names) // 2
    files = {"model-00001-of-00002.safetensors": (names[:half], "F32"),
             "model-00002-of-00002.safetensors": (names[half:], "BF16")}
    wmap = {}
    for f, (ns, dt) in files.items():
        write_st(os.path.join(d, f), {n: p[n] for n in ns}, dt)
        wmap.update({n: f for n in ns})
    json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump(c.hf(), open(os.path.join(d, "config.json"), "w"))


# ---- the model ------------------------------------------------------------------------------------------
def inv_freq(c):
    inv = 1.0 / (c.theta ** (torch.arange(0, c.HS, 2, dtype=torch.int64).float() / c.HS))
    s = c.scaling
    if s and s.get("rope_type") == "llama3":
        factor, lo, hi, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        inv = torch.where(medium, smoothed, out)
    return inv


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def forward(c, p, idx, lora=None):
    """lora: {module name: (A (r, in), B (out, r), scaling)} adds scaling * (x A^T) B^T to that nn.Linear."""
    B, T = idx.shape
    lora = lora or {}

    def linear(x, name):
        y = x @ p[name + ".weight"].T
        if name + ".bias" in p:
            y = y + p[name + ".bias"]
        if name in lora:
            a, b, s = lora[name]
            y = y + s * ((x @ a.T) @ b.T)
        return y

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.eps))

    freqs = torch.arange(T).float()[:, None] * inv_freq(c)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    group = c.NH // c.KVH
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = p["model.embed_tokens.weight"][idx]
    for l in range(c.L):
        pre = f"model.layers.{l}."
        h = rms(x, p[pre + "input_layernorm.weight"])
        q = linear(h, pre + "self_attn.q_proj").view(B, T, c.NH, c.HS).transpose(1, 2)
        k = linear(h, pre + "self_attn.k_proj").view(B, T, c.KVH, c.HS).transpose(1, 2)
        v = linear(h, pre + "self_attn.v_proj").view(B, T, c.KVH, c.HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(group, dim=1)  # repeat_kv
        v = v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c.HS)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, c.NH * c.HS)
        x = x + linear(y, pre + "self_attn.o_proj")
        h = rms(x, p[pre + "post_attention_layernorm.weight"])
        h = F.silu(linear(h, pre + "mlp.gate_proj")) * linear(h, pre + "mlp.up_proj")
        x = x + linear(h, pre + "mlp.down_proj")
    x = rms(x, p["model.norm.weight"])
    head = p["model.embed_tokens.weight"] if c.tied else p["lm_head.weight"]
    return x @ head.T


def step_loss(c, p, ids, score, step, B, T, accum, lora=None):
    micro = [o.batch(ids, score, step * accum + m, B, T) for m in range(accum)]
    count = sum(int((y >= 0).sum()) for _, y in micro)
    total = 0
    for x, y in micro:
        total = total + F.cross_entropy(forward(c, p, x, lora).view(-1, V), y.view(-1), ignore_index=-1, reduction="sum")
    return total / count


def compare_grads(name, grads, tensors, failures):
    worst = 0.0
    for k, t in tensors.items():
        e = float((grads[k] - t.grad).norm() / t.grad.norm().clamp_min(1e-12))
        worst = max(worst, e)
        if not e <= TOL_GRAD:
            failures.append(f"{name}: gradient of {k} differs by {e:.2e} (norm-relative)")
    if len(grads) != len(tensors):
        failures.append(f"{name}: anvil has {len(grads)} trainable tensors, expected {len(tensors)}")
    print(f"[{name}] step 0 gradients: worst norm-relative error {worst:.2e} over {len(tensors)} tensors")


def train_anvil(out, base, data, B, T, accum, steps, lr, warmup, wd, clip, extra=()):
    o.run([o.ANVIL, "train", "--init", base, "--data", data, "--tokenizer", "byte", "--shuffle", "off",
           "--val-fraction", "0", "--batch", str(B), "--seq", str(T), "--grad-accum", str(accum), "--steps",
           str(steps), "--lr", str(lr), "--warmup", str(warmup), "--lr-schedule", "cosine", "--min-lr-frac", "0.1",
           "--weight-decay", str(wd), "--grad-clip", str(clip), "--log-every", "1", "--out", out, "--threads", "2",
           *extra])
    return [json.loads(x)["loss"] for x in open(os.path.join(out, "metrics.jsonl"))]


def compare_losses(name, anvil_losses, torch_losses, steps, failures):
    worst = max(o.rel(a, b) for a, b in zip(anvil_losses, torch_losses))
    print(f"[{name}] {steps} AdamW steps: anvil {['%.5f' % x for x in anvil_losses]}")
    print(f"[{name}]                torch {['%.5f' % x for x in torch_losses]}  worst rel {worst:.2e}")
    if len(anvil_losses) != steps or not worst <= TOL_STEPS:
        failures.append(f"{name}: losses over {steps} steps differ by up to {worst:.2e}")


def full_scenario(tmp, name, c, data, stream, B, T, accum, steps=10, extra=()):
    failures = []
    base = os.path.join(tmp, name + "_init")
    p = make_params(c)
    write_model(base, c, p)
    ids, score = stream
    gpath = os.path.join(tmp, name + "_grads.safetensors")
    o.run([o.GRAD_DUMP, base, data, str(B), str(T), str(accum), gpath, *extra[1:]])
    grads, meta = o.read_safetensors(gpath)
    loss = step_loss(c, p, ids, score, 0, B, T, accum)
    loss.backward()
    r = o.rel(float(meta["loss"]), loss.item())
    print(f"[{name}] step 0 loss: anvil {float(meta['loss']):.8f} torch {loss.item():.8f} rel {r:.2e}")
    if not r <= TOL_GRAD:
        failures.append(f"{name}: step-0 loss differs by {r:.2e}")
    compare_grads(name, grads, p, failures)

    lr, warmup, wd, clip = 1e-3, 3, 0.1, 1.0
    anvil_losses = train_anvil(os.path.join(tmp, name + "_run"), base, data, B, T, accum, steps, lr, warmup, wd,
                               clip, extra)
    p2 = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    torch_losses = o.torch_adamw_losses(p2.values(), lambda s: step_loss(c, p2, ids, score, s, B, T, accum), steps,
                                        lr, warmup, wd, clip)
    compare_losses(name, anvil_losses, torch_losses, steps, failures)
    return failures


def lora_scenario(tmp, name, c, data, stream, r=4, alpha=8.0, B=3, T=24, accum=2, steps=10):
    failures = []
    base = os.path.join(tmp, name + "_base")
    p = make_params(c)
    for t in p.values():
        t.requires_grad_(False)
    write_model(base, c, p)
    ad = {}
    for l in range(c.L):
        for m in PROJ:
            full = f"model.layers.{l}.{'self_attn' if m in PROJ[:4] else 'mlp'}.{m}"
            fout, fin = p[full + ".weight"].shape
            ad[full] = ((0.2 * torch.randn(r, fin)).requires_grad_(True), (0.2 * torch.randn(fout, r)).requires_grad_(True))
    adir = os.path.join(tmp, name + "_adapter")
    os.makedirs(adir)
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
               "target_modules": PROJ, "fan_in_fan_out": False, "bias": "none", "use_rslora": False,
               "base_model_name_or_path": base}, open(os.path.join(adir, "adapter_config.json"), "w"))
    tensors = {}
    for k, (a, b) in ad.items():
        tensors[f"base_model.model.{k}.lora_A.weight"] = a
        tensors[f"base_model.model.{k}.lora_B.weight"] = b
    o.write_safetensors(os.path.join(adir, "adapter_model.safetensors"), tensors)
    s = alpha / r
    ids, score = stream
    gpath = os.path.join(tmp, name + "_grads.safetensors")
    o.run([o.GRAD_DUMP, base, data, str(B), str(T), str(accum), gpath, "alpaca", adir])
    grads, meta = o.read_safetensors(gpath)
    loss = step_loss(c, p, ids, score, 0, B, T, accum, {k: (a, b, s) for k, (a, b) in ad.items()})
    loss.backward()
    rl = o.rel(float(meta["loss"]), loss.item())
    print(f"[{name}] step 0 loss: anvil {float(meta['loss']):.8f} torch {loss.item():.8f} rel {rl:.2e}")
    if not rl <= TOL_GRAD:
        failures.append(f"{name}: step-0 loss differs by {rl:.2e}")
    flat = {}
    for k, (a, b) in ad.items():
        flat[k + ".lora_A.weight"], flat[k + ".lora_B.weight"] = a, b
    compare_grads(name, grads, flat, failures)

    lr, warmup, wd, clip = 2e-3, 2, 0.1, 0.5
    anvil_losses = train_anvil(os.path.join(tmp, name + "_run"), base, data, B, T, accum, steps, lr, warmup, wd,
                               clip, ("--adapter", adir))
    ad2 = {k: (a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)) for k, (a, b) in ad.items()}
    params = [t for ab in ad2.values() for t in ab]
    torch_losses = o.torch_adamw_losses(
        params, lambda st: step_loss(c, p, ids, score, st, B, T, accum, {k: (a, b, s) for k, (a, b) in ad2.items()}),
        steps, lr, warmup, wd, clip, group_decay=False)
    compare_losses(name, anvil_losses, torch_losses, steps, failures)
    return failures


def main():
    failures = []
    torch.manual_seed(4321)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        rng = np.random.default_rng(5)
        words = ["the", "cat", "sat", "on", "a", "mat", "GPU", "tensor", "1234", "héllo", "\n", "  "]
        with open(text, "w", encoding="utf-8") as f:
            f.write(" ".join(rng.choice(words) for _ in range(1500)))
        stream = o.stream_from_text(text)
        llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
        # grouped-query attention (4 heads share 2 key/value heads), Llama 3.1's rope scaling, untied head
        failures += full_scenario(tmp, "gqa", Cfg(scaling=llama3, theta=500000.0), text, stream, B=4, T=32, accum=2)
        # multi-head, tied head, instruction data with its prompt masked out of the loss
        inst = os.path.join(tmp, "inst.jsonl")
        with open(inst, "w") as f:
            for i in range(200):
                a, b = int(rng.integers(0, 100)), int(rng.integers(0, 100))
                f.write(json.dumps({"instruction": "Add the numbers.", "input": f"{a}+{b}", "output": str(a + b)}) + "\n")
        failures += full_scenario(tmp, "mha-tied", Cfg(KVH=4, tied=True), inst, o.stream_from_jsonl(inst), B=3, T=48,
                                  accum=2, extra=("--template", "compact"))
        failures += lora_scenario(tmp, "lora", Cfg(KVH=1), text, stream)
        # the relatives: Qwen2 (q, k, v biases, tied head as Qwen2.5's small models), Llama with every bias, a
        # Mistral whose 32-position sliding window is the context (T = 32 fills it)
        failures += full_scenario(tmp, "qwen2", Cfg(kind="qwen2", tied=True, theta=1000000.0), text, stream, B=4,
                                  T=32, accum=2)
        failures += full_scenario(tmp, "llama-bias", Cfg(bias=True), text, stream, B=3, T=24, accum=1)
        failures += full_scenario(tmp, "mistral-window", Cfg(kind="mistral", window=32), text, stream, B=3, T=32,
                                  accum=1)
        failures += lora_scenario(tmp, "qwen2-lora", Cfg(kind="qwen2", KVH=1), text, stream)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: anvil's Llama agrees with an independent PyTorch Llama")
    return 0


if __name__ == "__main__":
    sys.exit(main())
