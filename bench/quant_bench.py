#!/usr/bin/env python3
"""int8 weights (anvil quantize) against fp32 on this machine: batch-1 decode speed and validation loss.

Speed: a GPT-2-shaped model (12 layers, width 768, 12 heads, context 1024, GPT-2's BPE; made with `anvil train
--steps 1` unless --model is given) and its int8 copy each generate --max-new-tokens greedy tokens from the same
prompt, --reps times alternately; the median tokens/s (after the first token) and time to first token are reported.

Quality: a model trained on real text (--quality-model, or one trained here: 6 layers, width 384, context 256 on
the Node.js API documentation Debian ships in /usr/share/doc/nodejs/api, its last 5% held out) and its int8 copy
are scored by `anvil eval` on the held-out text; the relative difference of the losses is reported.

  python3 bench/quant_bench.py [--model DIR] [--quality-model DIR --val FILE] [--steps 600] [--threads N]
                               [--json FILE]
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import serve_bench  # noqa: E402  (its GPT-2-shaped model and vocabulary)

ANVIL = serve_bench.ANVIL


def anvil(*args, capture=True):
    r = subprocess.run([ANVIL, *args], capture_output=capture, text=True)
    if r.returncode != 0:
        sys.exit(f"anvil {' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def quantize(model, out):
    if not os.path.exists(out):
        print(anvil("quantize", "--model", model, "--out", out).strip(), flush=True)
    return out


def decode(model, args):
    r = json.loads(anvil("generate", "--model", model, "--prompt", "The server starts by reading its configuration",
                         "--max-new-tokens", str(args.max_new_tokens), "--no-stop", "--temperature", "0",
                         "--threads", str(args.threads), "--json"))
    return r["tokens_per_s"], r["time_to_first_token_ms"], r["text"]


def speed(args, tmp):
    f32 = args.model or serve_bench.make_model(tmp, args.threads)
    q8 = quantize(f32, os.path.join(tmp, "speed-int8"))
    runs = {"fp32": [], "int8": []}
    texts = {}
    for _ in range(args.reps):
        for name, m in (("fp32", f32), ("int8", q8)):
            tps, ttft, text = decode(m, args)
            runs[name].append((tps, ttft))
            texts[name] = text
    res = {}
    for name, rs in runs.items():
        res[name] = {"tokens_per_s": statistics.median(r[0] for r in rs),
                     "ttft_ms": statistics.median(r[1] for r in rs), "runs": rs}
        print(f"{name}: {res[name]['tokens_per_s']:.1f} tokens/s, first token {res[name]['ttft_ms']:.0f} ms "
              f"(median of {len(rs)})", flush=True)
    res["speedup"] = res["int8"]["tokens_per_s"] / res["fp32"]["tokens_per_s"]
    res["same_greedy_text"] = texts["fp32"] == texts["int8"]
    res["model"] = f32
    res["bytes"] = {k: os.path.getsize(os.path.join(m, "model.safetensors")) for k, m in (("fp32", f32), ("int8", q8))}
    return res


def corpus(tmp):
    files = sorted(glob.glob("/usr/share/doc/nodejs/api/*.md"))
    if not files:
        sys.exit("no text to train on: /usr/share/doc/nodejs/api/*.md is missing (apt-get install nodejs-doc), "
                 "or pass --quality-model and --val")
    text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in files)
    cut = int(len(text) * 0.95)
    train, val = os.path.join(tmp, "train.txt"), os.path.join(tmp, "val.txt")
    open(train, "w").write(text[:cut])
    open(val, "w").write(text[cut:])
    return train, val


def quality(args, tmp):
    model, val = args.quality_model, args.val
    if not model:
        train, val = corpus(tmp)
        run = os.path.join(tmp, "quality-run")
        print(f"training the quality model ({args.steps} steps) ...", flush=True)
        anvil("train", "--data", train, "--tokenizer", serve_bench.gpt2_vocab(), "--layers", "6", "--heads", "6",
              "--dim", "384", "--seq", "256", "--batch", "8", "--steps", str(args.steps), "--lr", "1e-3",
              "--warmup", "30", "--val-fraction", "0.01", "--log-every", "50", "--tensorboard", "off",
              "--threads", str(args.threads), "--out", run)
        model = os.path.join(run, "final")
    q8 = quantize(model, os.path.join(tmp, "quality-int8"))
    res = {"model": model, "val": val}
    for name, m in (("fp32", model), ("int8", q8)):
        r = json.loads(anvil("eval", "--model", m, "--data", val, "--batch", "8", "--seq", "256",
                             "--threads", str(args.threads), "--json"))
        res[name] = {"loss": r["loss"], "ppl": r["ppl"], "targets": r["targets"]}
        print(f"{name}: validation loss {r['loss']:.4f}, perplexity {r['ppl']:.2f} ({r['targets']} targets)",
              flush=True)
    res["loss_rel_diff"] = (res["int8"]["loss"] - res["fp32"]["loss"]) / res["fp32"]["loss"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="float model for the speed test (default: a 12-layer width-768 GPT-2)")
    ap.add_argument("--quality-model", help="a trained float model for the quality test")
    ap.add_argument("--val", help="held-out text for --quality-model")
    ap.add_argument("--steps", type=int, default=600, help="training steps of the quality model made here")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if bool(args.quality_model) != bool(args.val):
        sys.exit("--quality-model and --val go together")
    with tempfile.TemporaryDirectory(prefix="anvil_quant_bench_") as tmp:
        s = speed(args, tmp)
        q = quality(args, tmp)
    print("\n| weights | file MB | decode tokens/s (batch 1) | vs fp32 | validation loss | perplexity |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in ("fp32", "int8"):
        print(f"| {k} | {s['bytes'][k] / 1e6:.0f} | {s[k]['tokens_per_s']:.1f} | "
              f"{s[k]['tokens_per_s'] / s['fp32']['tokens_per_s']:.2f}x | {q[k]['loss']:.4f} | {q[k]['ppl']:.2f} |")
    print(f"\nint8 loss vs fp32: {100 * q['loss_rel_diff']:+.2f}%; same greedy text: {s['same_greedy_text']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"speed": s, "quality": q, "command": " ".join(sys.argv)}, f, indent=2)


if __name__ == "__main__":
    main()
