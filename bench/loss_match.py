#!/usr/bin/env python3
"""anvil's training loss against PyTorch's, step by step, from the same initial weights on the same tokens.

  1. Data: an `anvil data prepare` directory (--data), or one prepared here from --text files (--tokenizer).
  2. Weights: bench/torch_gpt_reference.py --save-init writes seeded GPT-2 (or, with --arch llama, Llama)
     weights as a Hugging Face directory; every run starts from it (anvil: --init).
  3. Runs, each --steps optimizer steps of --batch x --seq (x --grad-accum), the same schedule and AdamW:
     anvil (--precision), the PyTorch reference (bf16 autocast with torch.compile, or fp32 for --precision
     fp32), and with --fp8 anvil --precision fp8 too. Data order is anvil's --shuffle off, which the reference
     reproduces.
  4. Checks: every step's learning rate equal; anvil's loss within --tolerance (relative) of PyTorch's at every
     step after --after, each run's loss taken as its mean over the last --window steps (1: each step's own loss;
     in bf16 two implementations' single-batch losses drift apart and back by a few percent, zero on average, so
     the curve a user reads is the windowed one; the single-step worst gap is reported beside it); with --fp8,
     the fp8 run's final validation loss and its mean loss over the last 50 steps within --fp8-tolerance of the
     anvil bf16 run's.
Writes to --out: loss_match.json (every run's losses, the checks), summary.txt, logs.txt, each run's
metrics.jsonl (anvil-<precision>/, torch/, anvil-fp8/; the models stay in a scratch directory) and, where
gnuplot is installed, loss_match.png from `anvil plot` over the runs (else draw it later with that command).
Exit status 1 when a check fails.

On the GPU (issue 9's "Trained", GPT-2 124M on real text, bf16 both; what `bench/gpu_session.sh train` runs):
  python3 bench/loss_match.py --anvil build/anvil --data corpus --fp8 --steps 500 --out /tmp/match
On the CPU, a small model in fp32 (what the ctest oracle_loss_match runs):
  python3 bench/loss_match.py --anvil build/anvil --text docs/*.md --tokenizer byte --device cpu \\
      --precision fp32 --layers 2 --dim 64 --heads 4 --seq 64 --vocab 320 --batch 4 --steps 30 --after 0 \\
      --tolerance 1e-4 --no-compile --python /usr/bin/python3
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_train_bench  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anvil", default="build/anvil")
    p.add_argument("--python", default=sys.executable, help="the python3 that has torch")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="an `anvil data prepare` directory of plain text")
    src.add_argument("--text", nargs="+", help="text files to prepare (one document each)")
    src.add_argument("--recheck", help="no runs: check a loss_match.json's recorded losses again (with --after, "
                                       "--window and --tolerance)")
    p.add_argument("--tokenizer", default="byte", help="with --text: byte, or a directory of GPT-2 BPE files")
    p.add_argument("--val-fraction", type=float, default=0.05, help="with --text: documents held out")
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    p.add_argument("--ffn-dim", type=int, default=0, help="llama: MLP width (0: anvil's default)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=50, help="learning-rate warmup steps")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="anvil's precision; PyTorch runs bf16 autocast, or plain fp32")
    p.add_argument("--fp8", action="store_true", help="also run anvil --precision fp8 against anvil bf16")
    p.add_argument("--no-compile", action="store_true", help="PyTorch without torch.compile")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for both (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    p.add_argument("--tolerance", type=float, default=0.01, help="largest relative loss gap after --after")
    p.add_argument("--after", type=int, default=100, help="steps before the loss check starts")
    p.add_argument("--window", type=int, default=20,
                   help="the check compares each run's mean loss over this many steps up to each step (1: every "
                        "step's own loss)")
    p.add_argument("--fp8-tolerance", type=float, default=0.02)
    p.add_argument("--out", default=os.environ.get("OUT") or "loss-match")
    return p.parse_args()


def sh(cmd, out):
    """Runs cmd, its output appended to out/logs.txt (gpu_train_bench's runner); exits on failure."""
    return gpu_train_bench.sh(cmd, os.path.join(out, "logs.txt"))


def read_metrics(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return {r["step"]: r for r in rows}


def rel(a, b):
    return abs(a - b) / abs(b)


def anvil_run(a, init, data, precision, run_dir, out, keep):
    """Trains in run_dir (a scratch directory: the model is large) and keeps its metrics.jsonl in keep/."""
    sh([a.anvil, "train", "--init", init, "--data", data, "--device", a.device, "--precision", precision,
        "--seq", str(a.seq), "--batch", str(a.batch), "--grad-accum", str(a.grad_accum), "--steps", str(a.steps),
        "--lr", str(a.lr), "--warmup", str(a.warmup), "--lr-schedule", "cosine", "--min-lr-frac", "0.1",
        "--weight-decay", "0.1", "--grad-clip", "1.0", "--shuffle", "off", "--log-every", "1", "--eval-every",
        str(max(1, a.steps // 10)), "--tensorboard", "off", "--threads", str(a.threads), "--out", run_dir], out)
    os.makedirs(keep, exist_ok=True)
    shutil.copy(os.path.join(run_dir, "metrics.jsonl"), keep)
    return read_metrics(os.path.join(keep, "metrics.jsonl")), json.load(open(os.path.join(run_dir, "summary.json")))


def loss_gaps(mine, theirs, after, window):
    """Two runs' losses (step 1 first) compared after step `after`: the worst relative gap of single steps and
    of their means over `window` steps, the mean signed gap, the last step's."""
    n = len(mine)
    rel_ = [rel(x, y) for x, y in zip(mine, theirs)]
    checked = list(range(after, n))  # indices: step after + 1 on

    def windowed(v, i):  # the mean over the `window` steps up to index i
        w = v[max(0, i - window + 1):i + 1]
        return sum(w) / len(w)

    wrel = {i: rel(windowed(mine, i), windowed(theirs, i)) for i in checked}
    worst = max(checked, key=lambda i: rel_[i]) if checked else None
    wworst = max(checked, key=lambda i: wrel[i]) if checked else None
    signed = [(mine[i] - theirs[i]) / theirs[i] for i in checked]
    return {"worst_after": rel_[worst] if checked else None, "worst_step": worst + 1 if checked else None,
            "final": rel_[-1], "window": window,
            "windowed_worst_after": wrel[wworst] if checked else None,
            "windowed_worst_step": wworst + 1 if checked else None,
            "mean_signed_after": sum(signed) / len(signed) if signed else None}


def gap_lines(g, after, tolerance):
    if g["worst_step"] is None:
        return []
    return [f"loss, mean of the last {g['window']} steps: worst relative gap after step {after}: "
            f"{g['windowed_worst_after']:.2e} at step {g['windowed_worst_step']} (tolerance {tolerance:g})",
            f"loss, each step's own: worst relative gap after step {after}: {g['worst_after']:.2e} at step "
            f"{g['worst_step']}; mean signed gap {g['mean_signed_after']:+.2e}; at the last step {g['final']:.2e}"]


def recheck(a):
    """--recheck: the gaps of a loss_match.json's recorded losses, with this --after, --window, --tolerance."""
    losses = json.load(open(a.recheck))["losses"]
    mine = next(v for k, v in losses.items() if k.startswith("anvil-") and k != "anvil-fp8")
    g = loss_gaps(mine, losses["torch"], a.after, a.window)
    print("\n".join(gap_lines(g, a.after, a.tolerance)))
    return 0 if g["windowed_worst_after"] is not None and g["windowed_worst_after"] <= a.tolerance else 1


def main():
    a = parse()
    if a.recheck:
        return recheck(a)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="anvil-loss-match-")
    try:
        return compare(a, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(a, out, work):
    data = a.data
    if a.text:
        data = os.path.join(work, "data")
        sh([a.anvil, "data", "prepare", "--in", *a.text, "--tokenizer", a.tokenizer, "--val-fraction",
            str(a.val_fraction), "--out", data], out)
    meta = json.load(open(os.path.join(data, "meta.json")))
    train_tokens = meta["splits"]["train"]["tokens"]
    init = os.path.join(work, "init")
    ref = os.path.join(HERE, "torch_gpt_reference.py")
    shape = ["--arch", a.arch, "--layers", str(a.layers), "--heads", str(a.heads), "--dim", str(a.dim), "--seq",
             str(a.seq), "--vocab", str(a.vocab), "--kv-heads", str(a.kv_heads), "--ffn-dim", str(a.ffn_dim)]
    sh([a.python, ref, "--save-init", init, "--seed", str(a.seed), *shape], out)

    runs, summaries = {}, {}
    for name, precision in [(f"anvil-{a.precision}", a.precision)] + ([("anvil-fp8", "fp8")] if a.fp8 else []):
        runs[name], summaries[name] = anvil_run(a, init, data, precision, os.path.join(work, name), out,
                                                os.path.join(out, name))
    torch_cmd = [a.python, ref, "--init", init, "--data", data, *shape, "--batch", str(a.batch), "--grad-accum",
                 str(a.grad_accum), "--warmup", "0", "--steps", str(a.steps), "--lr", str(a.lr), "--lr-warmup",
                 str(a.warmup), "--lr-schedule", "cosine", "--min-lr-frac", "0.1", "--device", a.device, "--dtype",
                 "bf16" if a.precision == "bf16" else "fp32", "--threads", str(a.threads), "--metrics",
                 os.path.join(out, "torch", "metrics.jsonl")]
    if a.no_compile:
        torch_cmd.append("--no-compile")
    torch_summary = json.loads(sh(torch_cmd, out).strip().splitlines()[-1])
    runs["torch"] = read_metrics(os.path.join(out, "torch", "metrics.jsonl"))

    base, torch_rows = runs[f"anvil-{a.precision}"], runs["torch"]
    steps = list(range(1, a.steps + 1))
    missing = [s for s in steps if s not in base or s not in torch_rows]
    assert not missing, f"steps missing from the metrics: {missing[:10]}"
    lr_gap = max(rel(base[s]["lr"], torch_rows[s]["lr"]) for s in steps)
    g = loss_gaps([base[s]["loss"] for s in steps], [torch_rows[s]["loss"] for s in steps], a.after, a.window)
    tail = steps[-min(50, len(steps)):]
    mean = {k: sum(r[s]["loss"] for s in tail) / len(tail) for k, r in runs.items()}
    checks = {"lr_equal": lr_gap <= 1e-6,
              "loss_within_tolerance": g["windowed_worst_after"] is not None and
              g["windowed_worst_after"] <= a.tolerance}
    res = {"command": " ".join(sys.argv), "config": vars(a), "train_tokens": train_tokens,
           "anvil": {k: {f: s.get(f) for f in ("tokens_per_s", "peak_mem_mb", "val_loss", "params")}
                     for k, s in summaries.items()},
           "epochs": a.steps * a.batch * a.seq * a.grad_accum / train_tokens, "torch": torch_summary,
           "lr_max_rel_gap": lr_gap, "loss_rel_gap": g,
           f"mean_loss_last_{len(tail)}": mean,
           "losses": {k: [r[s]["loss"] for s in steps] for k, r in runs.items()}}
    model = "GPT-2" if a.arch == "gpt2" else f"Llama ({a.kv_heads or a.heads} KV heads)"
    lines = [f"{model} {a.layers}L/{a.dim}/{a.heads}H vocab {a.vocab}, {a.steps} steps of {a.batch} x {a.seq}"
             f"{f' x {a.grad_accum}' if a.grad_accum > 1 else ''} on {train_tokens} training tokens "
             f"({res['epochs']:.2f} epochs), {a.device}, anvil {a.precision} against PyTorch "
             f"{torch_summary['torch']} ({torch_summary['dtype']}, compile {torch_summary['compile']})",
             f"learning rates: largest relative gap {lr_gap:.1e}"]
    lines += gap_lines(g, a.after, a.tolerance)
    lines.append("mean loss over the last %d steps: %s" % (len(tail), ", ".join(
        f"{k} {v:.4f}" for k, v in mean.items())))
    if a.fp8:
        fp8, bf = summaries["anvil-fp8"], summaries[f"anvil-{a.precision}"]
        res["val_loss"] = {k: s.get("val_loss") for k, s in summaries.items()}
        vgap = rel(fp8["val_loss"], bf["val_loss"]) if fp8.get("val_loss") and bf.get("val_loss") else None
        mgap = rel(mean["anvil-fp8"], mean[f"anvil-{a.precision}"])
        res["fp8_gap"] = {"val_loss": vgap, "mean_loss_tail": mgap}
        checks["fp8_within_tolerance"] = vgap is not None and vgap <= a.fp8_tolerance and mgap <= a.fp8_tolerance
        lines.append(f"fp8 against anvil {a.precision}: validation loss {fp8.get('val_loss')} vs "
                     f"{bf.get('val_loss')} ({100 * vgap:.2f}%), last-{len(tail)} mean {100 * mgap:.2f}% "
                     f"(tolerance {100 * a.fp8_tolerance:g}%)" if vgap is not None else
                     "fp8: no validation loss to compare (the data has no validation split)")
    res["checks"] = checks
    ok = all(checks.values())
    lines.append(("PASSED: " if ok else "FAILED: ") + ", ".join(f"{k} {v}" for k, v in checks.items()))
    plot = os.path.join(out, "loss_match.png")
    dirs = [os.path.join(out, k) for k in (f"anvil-{a.precision}", "torch", "anvil-fp8") if k in runs]
    if shutil.which("gnuplot"):
        sh([a.anvil, "plot", *dirs, "--out", plot], out)
        lines.append(f"plot: {plot}")
    else:
        lines.append("plot: gnuplot is not installed here; draw it elsewhere with anvil plot " +
                     " ".join(os.path.basename(d) for d in dirs))
    with open(os.path.join(out, "loss_match.json"), "w") as f:
        json.dump(res, f, indent=1)
    text = "\n".join(lines)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
