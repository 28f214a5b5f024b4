#!/usr/bin/env python3
"""Tensor-parallel training under `mpirun --oversubscribe`, one thread per rank (issue 13's Must show):

  1. `--tensor-parallel 2` on 2 ranks equals one process (losses within 1e-5 relative over 20 steps, shuffle
     off): GPT-2 with accumulation, Llama with grouped-query attention, alone and with --recompute full;
  2. 4 ranks as 2 replicas x 2-way tensor parallel equal one process with the replicas' batch, also with
     --zero 1;
  3. a tensor-parallel checkpoint is an ordinary Hugging Face directory (the same tensor names and whole
     shapes as one process writes, also in optimizer.safetensors); it resumes on 2 ranks bit for bit, and in
     one process (saying so) within 1e-5; a one-process checkpoint resumes tensor parallel;
  4. bad input names the flag: a world size K does not divide, heads or MLP width K does not divide,
     --tensor-parallel without a launcher, LoRA; nothing is left behind.
Skips (exit 77) where mpirun or the MPI plugin is missing.
"""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ANVIL, check as check_line, report, run as anvil_run, text_file  # noqa: E402
import mpi  # noqa: E402
from mpi import losses, worst  # noqa: E402

RUN = ["--layers", "2", "--dim", "32", "--threads", "1", "--log-every", "1", "--lr", "3e-3", "--eval-examples", "0",
       "--shuffle", "off"]


def mpirun(n, args, timeout=300):
    return mpi.run(n, [ANVIL, *args], timeout=timeout)


def header(path):
    """{tensor name: shape} of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return {k: v["shape"] for k, v in h.items() if k != "__metadata__"}


def main():
    tmp = mpi.training_workdir(ANVIL, "anvil_tp_")
    if tmp is None:
        return 77
    failures = []

    def check(cond, msg):
        check_line(cond, msg, failures)

    data = text_file(tmp, n_words=20000)

    # 1 and 2: tensor parallel (x data parallel) == one process
    cases = [
        ("GPT-2, 2-way tensor parallel, 2 x accumulation", ["--heads", "2", "--seq", "16"], 2, 1, 2, []),
        ("Llama (GQA 4 heads, 2 kv heads), 2-way tensor parallel",
         ["--arch", "llama", "--heads", "4", "--kv-heads", "2", "--seq", "16"], 2, 1, 1, []),
        ("Llama, 2-way tensor parallel, --recompute full (the backward's second forward all-reduces again)",
         ["--arch", "llama", "--heads", "4", "--kv-heads", "2", "--seq", "16"], 2, 1, 2, ["--recompute", "full"]),
        ("GPT-2, 2 replicas x 2-way tensor parallel", ["--heads", "2", "--seq", "16"], 4, 2, 1, []),
        ("GPT-2, 2 replicas x 2-way tensor parallel, ZeRO-1", ["--heads", "2", "--seq", "16"], 4, 2, 1,
         ["--zero", "1"]),
    ]
    for i, (name, args, ranks, replicas, accum, extra) in enumerate(cases):
        tag = str(i)
        common = ["train", *RUN, *args, "--data", data, "--steps", "20", "--grad-accum", str(accum)]
        one = anvil_run([*common, "--batch", str(2 * replicas), "--out", "one" + tag], timeout=300)
        tp = mpirun(ranks, [*common, "--batch", "2", "--tensor-parallel", "2", *extra, "--out", "tp" + tag])
        if one.returncode or tp.returncode:
            check(False, f"{name}: both runs succeed ({one.stderr[-400:]} {tp.stderr[-600:]})")
            continue
        if ranks == 4 and not extra:
            check("tensor parallel: 2 groups of 2 ranks" in tp.stderr and "data parallel over 2 replicas" in tp.stderr,
                  "the start-up lines name the groups and the replicas")
        d, n = worst(losses("tp" + tag), losses("one" + tag))
        check(n == 20 and d <= 1e-5, f"{name} equals one process over {n} steps (worst relative loss difference "
              f"{d:.2e})")

    # 3. checkpoints: whole tensors with Hugging Face names; resume with any K
    args = ["train", *RUN, "--heads", "2", "--seq", "16", "--data", data, "--steps", "20", "--batch", "2",
            "--save-every", "10", "--keep-checkpoints", "0"]
    one = anvil_run([*args, "--out", "c_one"], timeout=300)
    tp = mpirun(2, [*args, "--tensor-parallel", "2", "--out", "c_tp"])
    if one.returncode or tp.returncode:
        check(False, f"checkpointed runs succeed ({one.stderr[-300:]} {tp.stderr[-600:]})")
    else:
        for f, name in [("model.safetensors", "transformer.h.0.attn.c_attn.weight"),
                        ("optimizer.safetensors", "exp_avg.transformer.h.0.attn.c_attn.weight")]:
            a, b = header(f"c_tp/checkpoint-10/{f}"), header(f"c_one/checkpoint-10/{f}")
            check(a == b and a.get(name) == [32, 96],
                  f"the tensor-parallel {f} holds whole tensors under the one-process names and shapes")
        ev_tp = anvil_run(["eval", "--model", "c_tp/final", "--data", data, "--threads", "1"], timeout=300)
        ev_one = anvil_run(["eval", "--model", "c_one/final", "--data", data, "--threads", "1"], timeout=300)
        first = (lambda r: r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-200:])
        check(ev_tp.returncode == 0 and first(ev_tp).split()[:2] == first(ev_one).split()[:2],
              f"anvil eval reads the tensor-parallel model as any other ({first(ev_tp)} vs {first(ev_one)})")
        same = mpirun(2, ["train", "--resume", "c_tp/checkpoint-10", "--out", "c_same"])
        a = losses("c_same") if same.returncode == 0 else {}
        check(len(a) == 10 and all(a[s] == losses("c_tp")[s] for s in a),
              "a tensor-parallel checkpoint resumes tensor parallel bit for bit" +
              ("" if same.returncode == 0 else f" ({same.stderr[-400:]})"))
        r = anvil_run(["train", "--resume", "c_tp/checkpoint-10", "--out", "c_on1"], timeout=300)
        d, n = worst(losses("c_on1"), losses("c_tp")) if r.returncode == 0 else (float("inf"), 0)
        check(n == 10 and d <= 1e-5 and "resuming a 2-way tensor-parallel checkpoint in one process" in r.stderr,
              f"a tensor-parallel checkpoint resumes in one process, saying so ({n} steps, {d:.2e})")
        r = mpirun(2, ["train", "--resume", "c_one/checkpoint-10", "--tensor-parallel", "2", "--out", "c_to_tp"])
        d, n = worst(losses("c_to_tp"), losses("c_one")) if r.returncode == 0 else (float("inf"), 0)
        check(n == 10 and d <= 1e-5 and "is now whole, split over 2 tensor-parallel ranks" in r.stderr,
              f"a one-process checkpoint resumes tensor parallel, saying so ({n} steps, {d:.2e})")

    # 4. bad input
    small = ["train", *RUN, "--data", data, "--steps", "2", "--batch", "2", "--seq", "16"]
    tune = ["train", "--init", "c_one/final", "--data", data, "--steps", "2", "--batch", "2", "--threads", "1"]
    bad = [
        (3, [*small, "--heads", "2", "--tensor-parallel", "2"], "the job's 3 ranks do not split into groups of 2"),
        (2, [*small, "--heads", "1", "--tensor-parallel", "2"],
         "the model's 1 attention heads do not split evenly over 2"),
        (2, [*small, "--arch", "llama", "--heads", "4", "--ffn-dim", "33", "--tensor-parallel", "2"],
         "the model's 33 MLP columns do not split evenly over 2"),
        (2, [*small, "--arch", "llama", "--heads", "4", "--kv-heads", "1", "--tensor-parallel", "2"],
         "the model's 1 key/value heads do not split evenly"),
        (2, [*tune, "--lora-rank", "4", "--tensor-parallel", "2"],
         "LoRA fine-tuning does not combine with tensor parallelism"),
    ]
    for k, (n, args, want) in enumerate(bad):
        out = f"bad{k}"
        r = mpirun(n, [*args, "--out", out])
        check(r.returncode != 0 and want in r.stderr and "--tensor-parallel" in r.stderr and not os.path.exists(out),
              f"refused naming the flag: {want}" + ("" if want in r.stderr else f" ({r.stderr[-300:]})"))
    r = anvil_run([*small, "--heads", "2", "--tensor-parallel", "2", "--out", "alone"])
    check(r.returncode != 0 and "launch them with mpirun -np 2" in r.stderr and not os.path.exists("alone"),
          "--tensor-parallel in one process says how to launch the ranks")

    shutil.rmtree(tmp, ignore_errors=True)
    return report(failures, "PASSED: tensor-parallel training under mpirun")


if __name__ == "__main__":
    sys.exit(main())
