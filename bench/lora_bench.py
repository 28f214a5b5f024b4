#!/usr/bin/env python3
"""LoRA against full fine-tuning on one machine, same model, data, batch and threads, in one run.

A 12-layer, width-768 GPT-2 (byte vocabulary) is made once as the base; then `anvil train --init BASE` runs
the same steps twice: fine-tuning every weight, and LoRA (rank 8 on c_attn, c_proj, c_fc, the base frozen).
Reported: tokens/s, peak memory (resident set on the CPU, device peak on CUDA), the optimizer state's bytes
on disk (AdamW moments; the master copy is in memory on GPUs only), and the ratios.

  /usr/bin/python3 bench/lora_bench.py --anvil build/anvil [--steps 8] [--batch 4] [--seq 128] [--threads N]
                                       [--device cpu] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        words = ["alpha", "beta", "gamma", "delta", "tensor", "GPU", "the", "of", "and", "\n"]
        with open(data, "w") as f:
            f.write(" ".join(words[(i * 7 + i // 3) % len(words)] for i in range(200000)))
        common = ["--data", data, "--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads),
                  "--device", a.device, "--tensorboard", "off", "--eval-examples", "0", "--val-fraction", "0.01",
                  "--eval-batches", "1", "--log-every", "1"]
        base_run = os.path.join(tmp, "base")
        subprocess.run([a.anvil, "train", *common, "--layers", "12", "--heads", "12", "--dim", "768", "--steps", "1",
                        "--out", base_run], check=True, capture_output=True)
        base = os.path.join(base_run, "final")
        rows = {}
        for name, extra in (("full fine-tuning", []),
                            ("LoRA r=8 (c_attn, c_proj, c_fc)", ["--lora-rank", "8", "--lora-alpha", "16",
                                                                 "--lora-targets", "c_attn,c_proj,c_fc"])):
            out = os.path.join(tmp, "ft" + str(len(rows)))
            subprocess.run([a.anvil, "train", *common, "--init", base, "--steps", str(a.steps), "--out", out, *extra],
                           check=True, capture_output=True)
            s = json.load(open(os.path.join(out, "summary.json")))
            # tokens/s over the steps after the first (warm-up: library plans, first touches of memory)
            m = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))][1:]
            tps = sum(x["tokens_per_s"] for x in m) / len(m)
            peak = s["peak_mem_mb"] if a.device == "cuda" else s["peak_rss_mb"]
            rows[name] = {"tokens_per_s": tps, "peak_mb": peak, "params": s["params"],
                          "trainable_params": s["trainable_params"],
                          "optimizer_state_mb": os.path.getsize(os.path.join(out, "final", "optimizer.safetensors")) / 2**20}
        full, lora = rows["full fine-tuning"], rows["LoRA r=8 (c_attn, c_proj, c_fc)"]
        mem = "device peak" if a.device == "cuda" else "peak RSS"
        print(f"model: 12 layers, width 768, 12 heads, context {a.seq}, batch {a.batch}, {full['params'] / 1e6:.1f}M "
              f"parameters; {a.steps} steps on {a.device}")
        print(f"{'':34} {'tokens/s':>10} {mem + ' MB':>14} {'trainable':>12} {'optimizer MB':>13}")
        for name, r in rows.items():
            print(f"{name:34} {r['tokens_per_s']:10.0f} {r['peak_mb']:14.0f} {r['trainable_params']:12d} "
                  f"{r['optimizer_state_mb']:13.1f}")
        speed, memory = lora["tokens_per_s"] / full["tokens_per_s"], lora["peak_mb"] / full["peak_mb"]
        print(f"LoRA / full: {speed:.2f}x tokens/s (goal >= 1.3x), {memory:.2f}x {mem} (goal <= 0.5x), "
              f"{lora['optimizer_state_mb'] / full['optimizer_state_mb']:.4f}x optimizer state")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rows": rows, "speed_ratio": speed, "memory_ratio": memory, "steps": a.steps,
                           "batch": a.batch, "seq": a.seq, "device": a.device}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
