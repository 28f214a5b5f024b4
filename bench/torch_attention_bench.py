#!/usr/bin/env python3
"""PyTorch's causal attention at the sizes `anvil_op_bench --sizes gpt2` times anvil's (GPT-2 124M: batch 8 and
64, context 1024, 12 heads of 64), forward and backward, printed in the op bench's columns so the two tables
compare line by line: fwd ms, bwd ms and GFLOP/s over 12 B T^2 C (the op bench's count: the forward's two
products, the backward's four, causal masking not discounted).

Each of PyTorch's fused kernels that this machine offers is timed: F.scaled_dot_product_attention restricted
to FlashAttention-2, to cuDNN's fused attention and to the memory-efficient kernel. On a machine without a GPU
(`--device cpu`) it times whatever SDPA picks there, which checks the script and nothing else.

  python3 bench/torch_attention_bench.py [--device cuda|cpu] [--dtype bf16|fp16|fp32] [--batch 8,64 --seq 1024
                                          --heads 12 --head-size 64] [--reps 20] [--json FILE]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def time_ms(fn, reps, sync):
    fn()  # warm-up (and the first call's kernel selection)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--batch", default="8", help="batch sizes, a comma list (8,64: GPT-2's op-bench size and llm.c's "
                                                 "micro-batch)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_attention_bench: no CUDA device visible to PyTorch (use --device cpu to check the script)")
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    T, NH, HS = a.seq, a.heads, a.head_size
    rows = []
    for B in (int(b) for b in a.batch.split(",")):
        C = NH * HS
        torch.manual_seed(0)
        # the packed (B, T, 3C) projection output a GPT-2 block hands attention, viewed per head as nanoGPT does
        qkv = torch.randn(B, T, 3 * C, device=a.device, dtype=dt, requires_grad=True)
        dout = torch.randn(B, NH, T, HS, device=a.device, dtype=dt)

        def heads():
            q, k, v = qkv.split(C, dim=2)
            return [x.view(B, T, NH, HS).transpose(1, 2) for x in (q, k, v)]

        sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
        kernels = [("default", None)]
        if a.device == "cuda":
            from torch.nn.attention import SDPBackend
            kernels = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                       ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
        flops = 12.0 * B * T * T * C
        name = f"attention B={B} T={T} NH={NH} HS={HS}"
        print(f"PyTorch {torch.__version__}, {a.device}"
              f"{' ' + torch.cuda.get_device_name() if a.device == 'cuda' else ''}, {a.dtype}, mean of {a.reps} runs")
        print(f"{'op':<52} {'fwd ms':>10} {'bwd ms':>10} {'GFLOP/s':>10}")
        mask = torch.ones(T, T, device=a.device, dtype=torch.bool).tril()
        if not hasattr(F, "scaled_dot_product_attention"):  # PyTorch before 2.0 (Debian's): the plain definition
            kernels = [("math", None)]

        def attend(q, k, v):
            if hasattr(F, "scaled_dot_product_attention"):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            s = (q @ k.transpose(-2, -1)) * HS**-0.5
            return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

        for label, backend in kernels:
            def fwd():
                return attend(*heads())

            def fwd_bwd():
                qkv.grad = None
                fwd().backward(dout)

            try:
                if backend is None:
                    f_ms, fb_ms = time_ms(fwd, a.reps, sync), time_ms(fwd_bwd, a.reps, sync)
                else:
                    from torch.nn.attention import sdpa_kernel
                    with sdpa_kernel(backend):
                        f_ms, fb_ms = time_ms(fwd, a.reps, sync), time_ms(fwd_bwd, a.reps, sync)
            except RuntimeError as e:  # a kernel this build or card does not offer for these sizes
                print(f"{name + ' torch-' + label:<52} not available: {str(e).splitlines()[0][:80]}")
                continue
            b_ms = fb_ms - f_ms
            rows.append({"batch": B, "kernel": label, "fwd_ms": f_ms, "bwd_ms": b_ms,
                         "gflops": flops / (fb_ms * 1e-3) / 1e9})
            print(f"{name + ' torch-' + label:<52} {f_ms:10.3f} {b_ms:10.3f} {rows[-1]['gflops']:10.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": a.device, "dtype": a.dtype,
                       "sizes": {"B": a.batch, "T": T, "NH": NH, "HS": HS}, "rows": rows}, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
