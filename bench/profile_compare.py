#!/usr/bin/env python3
"""Where anvil's step and PyTorch's go, side by side, from one gpu_train_bench.py record: anvil's `--profile`
(each op synchronised) and the reference's kernels under torch.profiler (--torch-profile-steps), grouped by
what they compute, in ms a step.

  python3 bench/profile_compare.py bench/results/2026-11-27-h200.json

PyTorch's kernels are grouped by name (cuDNN's attention kernels, cuBLAS's nvjet/gemm kernels, Triton's fused
LayerNorm, log-softmax and GELU kernels); what no group names is counted as "other".
"""
import argparse
import json
import sys

# anvil's ops and PyTorch's kernel names, by group
GROUPS = [  # in this order: a PyTorch kernel counts in the first group that names it
    ("attention forward", lambda op: op == "attention_fwd", lambda k: "sdpa" in k and "fprop" in k),
    ("attention backward", lambda op: op == "attention_bwd", lambda k: "sdpa" in k or "cudnn" in k),
    ("matrix products (with anvil's GELU)", lambda op: op.startswith("matmul"),
     lambda k: k.startswith("nvjet") or "gemm" in k.lower() or "cutlass" in k),
    ("loss over the logits", lambda op: op == "classifier", lambda k: "log_softmax" in k or "nll" in k),
    # anvil's add+layernorm_fwd: the residual add fused into the norm after it
    ("LayerNorm, forward and backward", lambda op: "layernorm" in op, lambda k: "layer_norm" in k),
    ("GELU (PyTorch's apart)", lambda op: False, lambda k: "gelu" in k),
    ("residual adds", lambda op: op == "residual_fwd", lambda k: False),
    ("AdamW", lambda op: op == "adamw", lambda k: "adam" in k.lower() or "multi_tensor" in k),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", help="a gpu_train_bench.json (bench/results/...)")
    r = json.load(open(ap.parse_args().record))
    prof, tp = r.get("profile") or [], r.get("torch_profile")
    if not prof or not tp:
        sys.exit("profile_compare: the record has no anvil profile or no torch_profile (run gpu_train_bench.py "
                 "with --profile-steps and --torch-profile-steps)")
    # anvil's profile counts each op over the steps it timed (the first is left out): AdamW runs once a step
    steps = next((op["calls"] for op in prof if op["op"] == "adamw"), 1)
    anvil = {op["op"]: op["total_ms"] / steps for op in prof}
    torch_k = {k["kernel"]: k["ms_per_step"] for k in tp["kernels"]}
    print(f"{r['device'].get('name', '?')}, commit {r['commit'][:10]}: ms a step "
          f"({r['config']['batch']} x {r['config']['seq']} x {r['config']['grad_accum']})")
    print(f"{'':40} {'anvil':>9} {'PyTorch':>9}")
    seen = set()
    for name, mine, theirs in GROUPS:
        a = sum(ms for op, ms in anvil.items() if mine(op))
        t = 0.0
        for k, ms in torch_k.items():
            if k not in seen and theirs(k):
                t += ms
                seen.add(k)
        print(f"{name:40} {a:9.1f} {t:9.1f}")
    print(f"{'other':40} {'':9} {sum(ms for k, ms in torch_k.items() if k not in seen):9.1f}")
    print(f"{'everything profiled':40} {sum(anvil.values()):9.1f} {tp['kernel_ms_per_step']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
