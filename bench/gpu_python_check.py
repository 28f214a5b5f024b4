#!/usr/bin/env python3
"""Issue 48's GPU check, on the card (bench/gpu_session.sh contact, step `python`): the Python layer with the
CUDA backend. A short `anvil.train(device="cuda")` on text, then the model loaded on CUDA and on the CPU:
`forward`'s logits on the device reach torch through `torch.from_dlpack` without a copy (same device, same
pointer; a write through torch is seen by a second view), and agree with the CPU's. Prints one JSON line;
exit 1 when a check fails.

    PYTHONPATH=<bundle>/python python3 bench/gpu_python_check.py
"""
import json
import os
import sys
import tempfile

import anvil
import numpy as np
import torch


def main():
    out = {"anvil": anvil.__version__, "torch": torch.__version__, "numpy": np.__version__, "checks": {}}
    ok = True

    def check(name, cond, detail=""):
        nonlocal ok
        out["checks"][name] = bool(cond) if not detail else f"{bool(cond)} ({detail})"
        ok = ok and bool(cond)

    with tempfile.TemporaryDirectory() as d:
        text = os.path.join(d, "text.txt")
        with open(text, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 400)
        seen = []
        summary = anvil.train(data=text, out=os.path.join(d, "run"), device="cuda", steps=30, layers=2, heads=2,
                              dim=64, seq=64, batch=8, eval_every=0, tensorboard="off", on_step=seen.append)
        check("train_cuda", summary.get("steps") == 30 and len(seen) == 30,
              f"loss {seen[0]['loss']:.3f} -> {seen[-1]['loss']:.3f}")
        gpu = anvil.Model.load(os.path.join(d, "run"), device="cuda")
        cpu = anvil.Model.load(os.path.join(d, "run"), device="cpu")
        check("device", gpu.device == "cuda", gpu.device)
        ids = np.random.default_rng(1).integers(0, 257, size=(4, 64))
        t = gpu.forward(ids)
        x = torch.from_dlpack(t)
        check("from_dlpack_on_device", x.is_cuda and x.data_ptr() == t.data_ptr(), str(x.device))
        ref = torch.from_dlpack(cpu.forward(ids))
        err = float((x.cpu() - ref).abs().max() / ref.abs().max())
        check("logits_match_cpu", err < 1e-3, f"max error {err:.2e} of the largest")
        kept = x.clone()
        del gpu
        torch.cuda.synchronize()
        check("outlives_model", torch.equal(x, kept))
        y = torch.from_dlpack(t)
        x[0, 0, 0] = 7.0
        check("shared_memory", float(y[0, 0, 0]) == 7.0)
        s = cpu.generate("the quick", temperature=0, max_new_tokens=8).text
        out["cpu_greedy"] = s
    out["ok"] = ok
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
