#!/usr/bin/env python3
"""The FP8 products tests/gpu/test_cuda_fp8_lt.cpp (CudaFp8Lt) tries through cuBLASLt directly, asked of
PyTorch's torch._scaled_mm on the same card: E4M3 x E4M3 -> bf16, tensor-wise scales, fast accumulation on and
off, at 64^3 and at GPT-2 124M's first FP8 product (2304 x 16384 x 768). Run with CUBLASLT_LOG_LEVEL=5 beside
the anvil test, the two API logs show which descriptor attributes PyTorch sets that anvil does not, so a
refusal is read, not guessed. Also prints the cuBLASLt each side loads: PyTorch's own (pip's nvidia-cublas)
and the CUDA toolkit's (which anvil's binaries find first).

  CUBLASLT_LOG_LEVEL=5 python3 bench/torch_fp8_probe.py
"""
import ctypes
import glob
import os
import sys

import torch


def lt_version(path):
    try:
        return ctypes.CDLL(path).cublasLtGetVersion()
    except OSError as e:
        return f"not loadable ({e})"


def main():
    if not torch.cuda.is_available():
        print("torch_fp8_probe: no CUDA device")
        return 1
    print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}")
    # which libcublasLt this process loaded, and the toolkit's
    maps = open("/proc/self/maps").read().split("\n")
    loaded = sorted({l.split()[-1] for l in maps if "libcublasLt" in l})
    for p in loaded:
        print(f"cuBLASLt loaded by PyTorch: {p} (version {lt_version(p)})")
    for p in sorted(glob.glob("/usr/local/cuda/lib64/libcublasLt.so.*")):
        if os.path.islink(p):
            continue
        print(f"cuBLASLt of the toolkit: {p} (version {lt_version(p)})")
    if not hasattr(torch, "_scaled_mm"):
        print("this PyTorch has no torch._scaled_mm")
        return 1
    ok = True
    for m, n, k in ((64, 64, 64), (2304, 16384, 768)):
        # A (m, k) row-major, B (k, n) column-major: cuBLASLt's TN form, as _scaled_mm requires
        a = torch.ones(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.ones(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        for fast in (False, True):
            for what, sa, sb in (("scales 1.0", 1.0, 1.0), ("scales 0.5, 2.0", 0.5, 2.0)):
                s_a = torch.tensor(sa, device="cuda")
                s_b = torch.tensor(sb, device="cuda")
                try:
                    d = torch._scaled_mm(a, b, scale_a=s_a, scale_b=s_b, out_dtype=torch.bfloat16,
                                         use_fast_accum=fast)
                    torch.cuda.synchronize()
                    good = bool((d.float() == float(k)).all())
                    r = "ran" if good else f"ran, but D[0] = {d.flatten()[0].item()} (expected {k})"
                    ok = ok and good
                except Exception as e:  # the refusal, as PyTorch words it
                    r = f"refused: {str(e).splitlines()[0][:160]}"
                    ok = False
                print(f"torch._scaled_mm {m}x{n}x{k} TN, fast accumulation {'on ' if fast else 'off'}, "
                      f"{what:16} {r}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
