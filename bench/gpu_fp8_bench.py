#!/usr/bin/env python3
"""--precision fp8 against bf16 on one card: tokens/s, MFU and peak memory at GPT-2 124M and at a larger config
(24 layers, width 1024), each pair from the same data (bench/gpu_train_bench.py runs each training; PyTorch is
not run here). Prints a table and writes fp8_bench.json and fp8_summary.txt to --out.

  python3 bench/gpu_fp8_bench.py --anvil build-gpu/anvil --gpt2-vocab build/npm/package --out /tmp/fp8
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [  # name, layers, width, heads, batch
    ("gpt2-124M", 12, 768, 12, 16),
    ("gpt2-24L-1024", 24, 1024, 16, 8),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anvil", default="build/anvil")
    p.add_argument("--gpt2-vocab", default="build/npm/package")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results/fp8")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, lines = [], []
    for name, layers, dim, heads, batch in CONFIGS:
        runs = {}
        for precision in ("bf16", "fp8"):
            with tempfile.TemporaryDirectory(prefix="anvil-fp8-") as d:
                cmd = [sys.executable, os.path.join(HERE, "gpu_train_bench.py"), "--anvil", a.anvil, "--gpt2-vocab",
                       a.gpt2_vocab, "--precision", precision, "--layers", str(layers), "--dim", str(dim), "--heads",
                       str(heads), "--batch", str(batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
                       "--profile-steps", "0", "--skip-torch", "--out", d]
                print("+ " + " ".join(cmd), flush=True)
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stdout[-3000:], r.stderr[-3000:])
                    runs[precision] = {"error": (r.stdout + r.stderr)[-2000:]}
                    continue
                runs[precision] = json.load(open(os.path.join(d, "gpu_train_bench.json")))["anvil"]
        row = {"config": name, "layers": layers, "dim": dim, "heads": heads, "batch": batch, "seq": 1024}
        for prec, res in runs.items():
            row[prec] = {k: res.get(k) for k in ("tokens_per_s", "step_ms_median", "mfu_measured_bf16", "mfu_vs_989TF",
                                                  "peak_mem_gib", "losses", "error")}
        b, f = runs.get("bf16", {}), runs.get("fp8", {})
        if b.get("tokens_per_s") and f.get("tokens_per_s"):
            row["fp8_speedup"] = f["tokens_per_s"] / b["tokens_per_s"]
            row["final_loss_gap"] = abs(f["losses"][-1] - b["losses"][-1]) / b["losses"][-1]
            lines.append(f"{name:16} bf16 {b['tokens_per_s']:9.0f} tok/s  fp8 {f['tokens_per_s']:9.0f} tok/s  "
                         f"x{row['fp8_speedup']:.2f}  peak {b['peak_mem_gib']:.1f} / {f['peak_mem_gib']:.1f} GiB  "
                         f"MFU (bf16 peak) {100 * (b['mfu_measured_bf16'] or 0):.1f}% / "
                         f"{100 * (f['mfu_measured_bf16'] or 0):.1f}%")
        else:
            lines.append(f"{name:16} failed: see fp8_bench.json")
        rows.append(row)
    with open(os.path.join(a.out, "fp8_bench.json"), "w") as fh:
        json.dump({"command": " ".join(sys.argv), "steps": a.steps, "warmup": a.warmup, "runs": rows}, fh, indent=2)
    text = "\n".join(["fp8 (E4M3/E5M2 products, per-tensor power-of-two scales) against bf16, random-token data"]
                     + lines)
    with open(os.path.join(a.out, "fp8_summary.txt"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
