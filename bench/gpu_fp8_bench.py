#!/usr/bin/env python3
"""--precision fp8 (current scaling, then --fp8-scaling delayed) against bf16 on one card: tokens/s, MFU and peak
memory at GPT-2 124M and at a larger config
(24 layers, width 1024), or at GPT-2 XL's shape (--configs gpt2-1.5B: 48 layers x 1600, issue 44's FP8 goal), each
pair from the same data (bench/gpu_train_bench.py runs each training; PyTorch is
not run here). Then, from each run's --profile (every op synchronised), each linear layer's shape with its
product's time in bf16 and in fp8 (the fp8 op: the operands' amax, scales and rounding, and the FP8 product),
forward and backward: where fp8's time goes. Prints the tables and writes fp8_bench.json and fp8_summary.txt to
--out.

  python3 bench/gpu_fp8_bench.py --anvil build-gpu/anvil --gpt2-vocab build/npm/package --out /tmp/fp8
  python3 bench/gpu_fp8_bench.py --device cpu --tiny ...     (the script itself, on a small model)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [  # name, layers, width, heads, batch
    ("gpt2-124M", 12, 768, 12, 16),
    ("gpt2-24L-1024", 24, 1024, 16, 8),
    ("gpt2-1.5B", 48, 1600, 25, 4),  # issue 44's FP8 goal: GPT-2 XL's shape (--configs gpt2-1.5B)
]
DEFAULT_CONFIGS = "gpt2-124M,gpt2-24L-1024"
TINY = [("tiny", 2, 64, 4, 2)]
# a profile row's op: "matmul_fwd 16384x768>2304", "matmul_fp8_bwd 16384x768>2304", "matmul_fp8_fwd+gelu ..."
OP = re.compile(r"^matmul(_fp8)?_(fwd|bwd)(\+gelu)? (\d+x\d+>\d+)$")


def product_rows(bf16_profile, fp8_profile):
    """Per linear-layer shape and direction: ms a call in bf16 and in fp8, from the two runs' profiles (the
    shapes both runs have; the head's bf16 product, absent from fp8's FP8 ops, is left out)."""
    def table(profile, fp8):
        t = {}
        for r in profile or []:
            m = OP.match(r.get("op", ""))
            if m and bool(m.group(1)) == fp8:
                key = (m.group(4), m.group(2) + (m.group(3) or ""))
                calls, ms = t.get(key, (0, 0.0))
                t[key] = (calls + r["calls"], ms + r["total_ms"])
        return t
    b, f = table(bf16_profile, False), table(fp8_profile, True)
    rows = []
    for key in sorted(set(b) & set(f), key=lambda k: (-b[k][1], k)):
        (bc, bms), (fc, fms) = b[key], f[key]
        rows.append({"shape": key[0], "pass": key[1], "bf16_ms_per_call": bms / bc, "fp8_ms_per_call": fms / fc,
                     "bf16_total_ms": bms, "fp8_total_ms": fms})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anvil", default="build/anvil")
    p.add_argument("--gpt2-vocab", default="build/npm/package")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=3,
                   help="steps of each run's --profile, for the per-shape table (0: none)")
    p.add_argument("--device", default="cuda", help="cpu only to try the script itself (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="one small model instead of the configs")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="which configurations (comma list of " + ", ".join(c[0] for c in CONFIGS) + ")")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results/fp8")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, lines = [], []
    seq = 64 if a.tiny else 1024
    wanted = a.configs.split(",")
    unknown = [c for c in wanted if c not in [k[0] for k in CONFIGS]]
    if unknown:
        p.error(f"--configs: unknown {unknown}")
    for name, layers, dim, heads, batch in TINY if a.tiny else [c for c in CONFIGS if c[0] in wanted]:
        runs, profiles = {}, {}
        for precision in ("bf16", "fp8", "fp8_delayed"):
            with tempfile.TemporaryDirectory(prefix="anvil-fp8-") as d:
                scaling = ["--fp8-scaling", "delayed"] if precision == "fp8_delayed" else []
                cmd = [sys.executable, os.path.join(HERE, "gpu_train_bench.py"), "--anvil", a.anvil, "--gpt2-vocab",
                       a.gpt2_vocab, "--precision", precision.split("_")[0], *scaling, "--layers", str(layers),
                       "--dim", str(dim), "--heads",
                       str(heads), "--batch", str(batch), "--seq", str(seq), "--steps", str(a.steps), "--warmup",
                       str(a.warmup), "--profile-steps", str(a.profile_steps), "--skip-torch", "--device", a.device,
                       "--out", d]
                print("+ " + " ".join(cmd), flush=True)
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stdout[-3000:], r.stderr[-3000:])
                    runs[precision] = {"error": (r.stdout + r.stderr)[-2000:]}
                    continue
                res = json.load(open(os.path.join(d, "gpu_train_bench.json")))
                runs[precision], profiles[precision] = res["anvil"], res.get("profile") or []
        row = {"config": name, "layers": layers, "dim": dim, "heads": heads, "batch": batch, "seq": seq}
        for prec, res in runs.items():
            row[prec] = {k: res.get(k) for k in ("tokens_per_s", "step_ms_median", "mfu_measured_bf16", "mfu_vs_989TF",
                                                  "peak_mem_gib", "losses", "error")}
        b, f, fd = runs.get("bf16", {}), runs.get("fp8", {}), runs.get("fp8_delayed", {})
        if b.get("tokens_per_s") and f.get("tokens_per_s"):
            row["fp8_speedup"] = f["tokens_per_s"] / b["tokens_per_s"]
            row["final_loss_gap"] = abs(f["losses"][-1] - b["losses"][-1]) / b["losses"][-1]
            lines.append(f"{name:16} bf16 {b['tokens_per_s']:9.0f} tok/s  fp8 {f['tokens_per_s']:9.0f} tok/s  "
                         f"x{row['fp8_speedup']:.2f}  peak {b['peak_mem_gib']:.1f} / {f['peak_mem_gib']:.1f} GiB  "
                         f"MFU (bf16 peak) {100 * (b['mfu_measured_bf16'] or 0):.1f}% / "
                         f"{100 * (f['mfu_measured_bf16'] or 0):.1f}%")
        else:
            lines.append(f"{name:16} failed: see fp8_bench.json")
        if b.get("tokens_per_s") and fd.get("tokens_per_s"):  # --fp8-scaling delayed: no amax pass first
            row["fp8_delayed_speedup"] = fd["tokens_per_s"] / b["tokens_per_s"]
            row["fp8_delayed_final_loss_gap"] = abs(fd["losses"][-1] - b["losses"][-1]) / b["losses"][-1]
            lines.append(f"{'':16} fp8 delayed scaling {fd['tokens_per_s']:9.0f} tok/s  "
                         f"x{row['fp8_delayed_speedup']:.2f} bf16, final loss gap {row['fp8_delayed_final_loss_gap']:.4f}")
        if profiles.get("bf16") and profiles.get("fp8"):
            row["products"] = product_rows(profiles["bf16"], profiles["fp8"])
            row["profiles"] = profiles
            lines.append(f"  {'N x C > OC':22} {'pass':8} {'bf16 ms':>9} {'fp8 ms':>9} {'fp8/bf16':>9}   "
                         "(a call; --profile, each op synchronised)")
            for p in row["products"]:
                lines.append(f"  {p['shape']:22} {p['pass']:8} {p['bf16_ms_per_call']:9.3f} "
                             f"{p['fp8_ms_per_call']:9.3f} {p['fp8_ms_per_call'] / p['bf16_ms_per_call']:9.2f}")
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
