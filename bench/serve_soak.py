#!/usr/bin/env python3
"""Soak test of `anvil serve`: mixed load on loopback for a long while, watching for lost requests and memory
growth.

Starts the server over --model (or a small model it trains first: 2 layers, width 64, context 1024, the byte
tokenizer), then
--clients threads send requests back to back for --seconds, each drawn at random from a fixed mix:
  complete  a plain completion                         (expects 200 and a choice)
  stream    a streamed completion, read to [DONE]      (expects 200, events, [DONE])
  chat      a chat completion                          (expects 200 and a message)
  cancel    a streamed completion dropped after its first event (the server must free the sequence)
  long      a completion of a long prompt, 4 tokens    (expects 200: prefill under load)
  bad       a malformed body, or max_tokens -1         (expects 400 in OpenAI's error shape)
A request is lost when it gets no answer, an unexpected status or a malformed body. The server's resident
memory (VmRSS) is sampled every 5 s. The report: requests by kind, lost ones, p50/p99 latency of the complete
requests in the first and the last minute, and the memory after the first minute against the end.

Exit status 1 when a request was lost or the memory grew by more than --max-growth-mb (default 64) between the
end of the first minute (caches, pools and arenas warm) and the end.

  python3 bench/serve_soak.py [--seconds 600] [--clients 8] [--model DIR] [--json FILE]
"""
import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANVIL = os.environ.setdefault("ANVIL_BIN", os.path.join(ROOT, "build", "anvil"))
sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
from test_serve import Server  # noqa: E402  (the serving tests' server: --port 0, --threads 2)
WORDS = "alpha beta gamma delta tensor GPU 42 the model reads every weight once per step".split()
MIX = [("complete", 30), ("stream", 25), ("chat", 15), ("cancel", 10), ("long", 10), ("bad", 10)]


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: train a small one first)")
    p.add_argument("--seconds", type=float, default=600, help="how long the load runs")
    p.add_argument("--clients", type=int, default=8, help="threads sending requests back to back")
    p.add_argument("--long-words", type=int, default=120, help="words in a long prompt (the made model reads 1024 "
                   "bytes)")
    p.add_argument("--max-growth-mb", type=float, default=64, help="allowed VmRSS growth after the first minute")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def small_model(d):
    data = os.path.join(d, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(20000)))
    out = os.path.join(d, "run")
    subprocess.run([ANVIL, "train", "--data", data, "--out", out, "--steps", "10", "--layers", "2", "--dim", "64",
                    "--heads", "4", "--seq", "1024", "--batch", "2", "--threads", "2"], check=True,
                   capture_output=True)
    return os.path.join(out, "final")


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def prompt(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def one(port, kind, rng, long_words):
    """Sends one request of `kind`; returns None when it was answered as expected, else what went wrong."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        if kind == "bad":
            raw = rng.choice(['{"prompt": "alpha", "max_tokens": ', '{"prompt": "alpha", "max_tokens": -1}'])
            c.request("POST", "/v1/completions", body=raw, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            body = json.loads(r.read())
            return None if r.status == 400 and "error" in body else f"bad: status {r.status} body {body}"
        if kind == "chat":
            body = {"messages": [{"role": "user", "content": prompt(rng, 6)}], "max_tokens": 16}
            path = "/v1/chat/completions"
        else:
            n = long_words if kind == "long" else rng.randint(2, 12)
            body = {"prompt": prompt(rng, n), "max_tokens": 4 if kind == "long" else 24,
                    "temperature": rng.choice([0, 0.8])}
            path = "/v1/completions"
        if kind in ("stream", "cancel"):
            body["stream"] = True
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return f"{kind}: status {r.status} {r.read()[:200]!r}"
        if kind == "cancel":
            first = r.read(6)  # the first event's start (through the chunked encoding); then the client leaves
            c.sock.shutdown(socket.SHUT_RDWR)
            return None if first.startswith(b"data: ") else f"cancel: first line {first[:100]!r}"
        text = r.read().decode("utf-8", "replace")
        if kind == "stream":
            events = [b[6:] for b in text.split("\n\n") if b.startswith("data: ")]
            ok = events and events[-1] == "[DONE]" and all(json.loads(e) for e in events[:-1])
            return None if ok else f"stream: {text[-200:]!r}"
        reply = json.loads(text)
        ok = reply.get("choices") and ("message" in reply["choices"][0] or "text" in reply["choices"][0])
        return None if ok else f"{kind}: {text[:200]!r}"
    except Exception as e:  # noqa: BLE001 - every failure is a lost request, named
        return f"{kind}: {type(e).__name__}: {e}"
    finally:
        c.close()


def main():
    a = parse()
    with tempfile.TemporaryDirectory(prefix="anvil_soak_") as d:
        model = a.model or small_model(d)
        srv = Server(model)
        t0 = time.time()
        stop = time.time() + a.seconds
        records, lost, rss = [], [], []
        lock = threading.Lock()

        def client(i):
            rng = random.Random(1000 + i)
            kinds = [k for k, w in MIX for _ in range(w)]
            while time.time() < stop:
                kind = rng.choice(kinds)
                start = time.time()
                err = one(srv.port, kind, rng, a.long_words)
                with lock:
                    records.append((kind, start - t0, time.time() - start))
                    if err:
                        lost.append(err)

        def sampler():
            while time.time() < stop:
                rss.append((time.time() - t0, rss_mb(srv.proc.pid)))
                time.sleep(5)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        threads.append(threading.Thread(target=sampler))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rss.append((time.time() - t0, rss_mb(srv.proc.pid)))
        alive = srv.proc.poll() is None
        srv.stop()

    def lat(lo, hi):
        xs = sorted(dt for k, s, dt in records if k == "complete" and lo <= s < hi)
        if not xs:
            return None
        p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
        return {"n": len(xs), "p50_ms": 1e3 * statistics.median(xs), "p99_ms": 1e3 * p99}

    span = max(60.0, a.seconds / 10)
    warm = [m for s, m in rss if s >= min(span, a.seconds / 2)]
    res = {
        "seconds": a.seconds, "clients": a.clients, "server_threads": 2,
        "requests": {k: sum(1 for r in records if r[0] == k) for k, _ in MIX},
        "total": len(records), "lost": len(lost), "lost_examples": lost[:10],
        "latency_first": lat(0, span), "latency_last": lat(a.seconds - span, a.seconds + 1),
        "rss_mb_start": rss[0][1] if rss else None,
        "rss_mb_after_warmup": warm[0] if warm else None, "rss_mb_end": rss[-1][1] if rss else None,
        "rss_mb_max": max(m for _, m in rss) if rss else None,
        "server_alive_at_end": alive, "max_growth_mb": a.max_growth_mb,
        "rss_mb_samples": [[round(t, 1), round(m, 2)] for t, m in rss],
        "machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
    }
    growth = (res["rss_mb_end"] - res["rss_mb_after_warmup"]) if warm else 0.0
    res["rss_growth_mb"] = growth
    print(json.dumps({k: v for k, v in res.items() if k != "rss_mb_samples"}, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    bad = res["lost"] > 0 or growth > a.max_growth_mb or not alive
    print(f"soak: {res['total']} requests, {res['lost']} lost; complete p50/p99 "
          f"{res['latency_first']} -> {res['latency_last']}; VmRSS {res['rss_mb_after_warmup']:.1f} MB after the "
          f"warm-up, {res['rss_mb_end']:.1f} MB at the end ({growth:+.1f} MB, bound {a.max_growth_mb} MB): "
          f"{'FAIL' if bad else 'ok'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
