"""anvil serve end to end: a small model trained here, the server on 127.0.0.1, driven over HTTP.

- Same answers: temperature 0 and seeded sampling equal `anvil generate` (completions and chat), and so do
  OpenAI's presence and frequency penalties and the repetition_penalty and min_p extensions; logit_bias lifts a
  token over the rest; streamed text
  equals the plain text; several prompts in one request get a choice each, plain and streamed; stop strings cut the text; 64 concurrent clients (half streaming) all get the
  answers they get alone, and the scheduler really batched them.
- Bad input: malformed JSON, wrong types, missing prompt, max_tokens <= 0 or past the context, a prompt
  longer than the context, an unknown model (404), a body over --max-body-mb (413), an unknown path (404),
  n = 0: each a 4xx with OpenAI's error body, and the server keeps serving.
- OpenAI's n: n choices a prompt, choice j drawn with seed + j, as `anvil generate --num-samples` draws
  sample j; the same prompt listed twice gets two draws; usage counts each prompt once.
- Prefix caching: prompts that begin alike take the pages the first one filled (counted in /metrics) and
  still get generate's answers; with --prefix-cache off nothing is taken.
- A client that drops mid-stream, or while it waits for a whole answer, frees its sequence; a full queue answers 429; SIGTERM drains (running
  requests finish, new ones get 503) and exits 0.
- Slow clients: 160 connections sending a byte every half second do not hold up the others and are cut off
  with 408 at --request-timeout; idle connections close at --idle-timeout; past --max-connections, 503.
- The official OpenAI client (npm `openai`): models, completions plain and streamed, chat plain and
  streamed, usage counts; skipped with a notice when node/npm or the registry are missing.
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
import common  # noqa: E402
from common import check, run  # noqa: E402

ANVIL = common.ANVIL
NPM_CACHE = os.environ.get("ANVIL_NPM_CACHE", os.path.join(os.path.dirname(os.path.abspath(ANVIL)), "npm"))
PROMPTS = ["alpha beta", "gamma", "tensor GPU 42", "delta delta", "beta gamma delta", "42", "GPU", "alpha"]
MAX_TOKENS = 24


class Server:
    def __init__(self, model, *extra, env=None):
        self.proc = subprocess.Popen([ANVIL, "serve", "--model", model, "--port", "0", "--threads", "2", *extra],
                                     stderr=subprocess.PIPE, text=True, errors="replace", env=env)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(60)
        if self.port is None:
            raise AssertionError("the server did not start:\n" + "".join(self.lines))

    def saw(self, text, timeout=10):
        """True once a line of the server's log holds `text` (the lines after the address may come later)."""
        end = time.time() + timeout
        while not any(text in x for x in self.lines) and time.time() < end:
            time.sleep(0.05)
        return any(text in x for x in self.lines)

    def request(self, method, path, body=None, raw=None, timeout=120, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, text

    def post(self, path, body):
        status, text = self.request("POST", path, body)
        return status, json.loads(text)

    def stream(self, path, body):
        """The SSE events' JSON objects, and whether [DONE] ended them."""
        status, text = self.request("POST", path, dict(body, stream=True))
        events, done = [], False
        for block in text.split("\n\n"):
            if not block.startswith("data: "):
                continue
            payload = block[len("data: "):]
            if payload == "[DONE]":
                done = True
            else:
                events.append(json.loads(payload))
        return status, events, done

    def metric(self, name):
        _, text = self.request("GET", "/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def generate(model, *args):
    r = run(["generate", "--model", model, "--threads", "2", *args], check=True)
    return r.stdout


def reference(model, prompt, max_tokens=MAX_TOKENS, extra=()):
    out = json.loads(generate(model, "--prompt", prompt, "--max-new-tokens", str(max_tokens), "--temperature", "0",
                              "--json", *extra))
    return out


def streamed_text(events, chat=False):
    parts = []
    for e in events:
        for c in e.get("choices", []):
            parts.append(c["delta"].get("content", "") if chat else c["text"])
    return "".join(parts)


def finish_of(events):
    reasons = [c["finish_reason"] for e in events for c in e.get("choices", []) if c["finish_reason"]]
    return reasons[-1] if reasons else None


def same_answers(srv, model, refs, failures):
    for p in PROMPTS[:3]:
        st, r = srv.post("/v1/completions", {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0})
        ref = refs[p]
        check(st == 200 and r["choices"][0]["text"] == ref["text"]
              and r["choices"][0]["finish_reason"] == ref["finish_reason"],
              f"completions at temperature 0 equal anvil generate for {p!r}", failures)
        check(r["usage"] == {"prompt_tokens": ref["prompt_tokens"], "completion_tokens": ref["completion_tokens"],
                             "total_tokens": ref["prompt_tokens"] + ref["completion_tokens"]}
              and r["object"] == "text_completion", f"usage counts for {p!r}: {r['usage']}", failures)
        st, ev, done = srv.stream("/v1/completions", {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0})
        check(st == 200 and done and streamed_text(ev) == ref["text"] and finish_of(ev) == ref["finish_reason"],
              f"streamed text equals the plain one for {p!r}", failures)
    # several prompts in one request: a choice each, in order, each its own answer
    many = PROMPTS[:4]
    body = {"prompt": many, "max_tokens": MAX_TOKENS, "temperature": 0}
    st, r = srv.post("/v1/completions", body)
    got = [(c["index"], c["text"], c["finish_reason"]) for c in r.get("choices", [])]
    want = [(i, refs[p]["text"], refs[p]["finish_reason"]) for i, p in enumerate(many)]
    check(st == 200 and got == want and r["usage"]["prompt_tokens"] == sum(refs[p]["prompt_tokens"] for p in many)
          and r["usage"]["completion_tokens"] == sum(refs[p]["completion_tokens"] for p in many),
          f"4 prompts in one request: 4 choices, generate's answers, usage summed ({r.get('usage')})", failures)
    st, ev, done = srv.stream("/v1/completions", dict(body, stream_options={"include_usage": True}))
    per = {}
    for e in ev:
        for c in e["choices"]:
            per.setdefault(c["index"], []).append(c)
    streamed = [("".join(c["text"] for c in per.get(i, [])), [c["finish_reason"] for c in per.get(i, [])
                                                              if c["finish_reason"]]) for i in range(len(many))]
    check(st == 200 and done and streamed == [(refs[p]["text"], [refs[p]["finish_reason"]]) for p in many]
          and ev[-1]["usage"] == r["usage"], "4 prompts streamed: each choice's text by its index, one finish each",
          failures)
    # seeded sampling: reproducible per request, and the same as generate with that seed
    body = {"prompt": "alpha", "max_tokens": MAX_TOKENS, "temperature": 0.9, "seed": 5}
    a = srv.post("/v1/completions", body)[1]["choices"][0]["text"]
    b = srv.post("/v1/completions", body)[1]["choices"][0]["text"]
    g = json.loads(generate(model, "--prompt", "alpha", "--max-new-tokens", str(MAX_TOKENS), "--temperature", "0.9",
                            "--seed", "5", "--json"))["text"]
    check(a == b == g, f"seed 5 at temperature 0.9: the same text twice and as generate's ({a!r})", failures)
    n_choices(srv, model, failures)
    # OpenAI's penalties: the server's answer is generate's with the same flags, and they change the answer
    body = {"prompt": "alpha", "max_tokens": MAX_TOKENS, "temperature": 0, "presence_penalty": 1.5,
            "frequency_penalty": 2}
    st, r = srv.post("/v1/completions", body)
    g = json.loads(generate(model, "--prompt", "alpha", "--max-new-tokens", str(MAX_TOKENS), "--temperature", "0",
                            "--presence-penalty", "1.5", "--frequency-penalty", "2", "--json"))["text"]
    plain = refs["alpha"]["text"] if "alpha" in refs else None
    check(st == 200 and r["choices"][0]["text"] == g,
          f"presence_penalty 1.5, frequency_penalty 2: generate's answer ({g!r}; without them {plain!r})", failures)
    # the extensions vLLM and llama.cpp take: repetition_penalty (prompt and answer) and min_p, as generate does
    body = {"prompt": "alpha", "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": 3, "repetition_penalty": 1.8,
            "min_p": 0.1}
    st, r = srv.post("/v1/completions", body)
    g = json.loads(generate(model, "--prompt", "alpha", "--max-new-tokens", str(MAX_TOKENS), "--temperature", "0.8",
                            "--seed", "3", "--repetition-penalty", "1.8", "--min-p", "0.1", "--json"))["text"]
    check(st == 200 and r["choices"][0]["text"] == g, f"repetition_penalty 1.8, min_p 0.1: generate's answer ({g!r})",
          failures)
    # logit_bias: one token lifted over every other is the whole greedy answer
    st, r = srv.post("/v1/completions", {"prompt": "alpha", "max_tokens": 5, "temperature": 0,
                                         "logit_bias": {str(ord("q")): 100}})
    check(st == 200 and r["choices"][0]["text"] == "qqqqq", f"logit_bias 'q': +100 writes qqqqq ({r})", failures)
    # stop strings cut the text before them
    text = refs[PROMPTS[0]]["text"]
    stop = text[6:9]
    st, r = srv.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0,
                                         "stop": [stop, "\u00e9never"]})
    check(st == 200 and r["choices"][0]["text"] == text[:text.find(stop)]
          and r["choices"][0]["finish_reason"] == "stop", f"stop {stop!r} ends the text before it", failures)
    st, ev, done = srv.stream("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0,
                                                  "stop": stop})
    check(done and streamed_text(ev) == text[:text.find(stop)] and finish_of(ev) == "stop",
          "streamed, the stop string is held back and never sent", failures)
    # chat: the model's template, as generate --chat renders it
    chat_ref = generate(model, "--chat", "--prompt", "alpha", "--max-new-tokens", "12", "--temperature", "0")
    chat_ref = chat_ref[:-1] if chat_ref.endswith("\n") else chat_ref
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "alpha"}], "max_tokens": 12,
                                              "temperature": 0})
    check(st == 200 and r["object"] == "chat.completion" and r["choices"][0]["message"] == {
        "role": "assistant", "content": chat_ref}, f"chat completion equals generate --chat ({chat_ref!r})", failures)
    st, ev, done = srv.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "alpha"}],
                                                       "max_tokens": 12, "temperature": 0})
    check(done and ev[0]["choices"][0]["delta"].get("role") == "assistant"
          and streamed_text(ev, chat=True) == chat_ref and ev[0]["object"] == "chat.completion.chunk",
          "streamed chat: the role first, then the same text", failures)


def clients(srv, refs, n):
    """n clients at once, every other one streaming, PROMPTS in turn at temperature 0: the ones whose status,
    text or finish reason differ from generate's, and their results."""
    results = [None] * n

    def client(i):
        p = PROMPTS[i % len(PROMPTS)]
        body = {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0}
        try:
            if i % 2:
                st, ev, done = srv.stream("/v1/completions", body)
                results[i] = (st, streamed_text(ev), finish_of(ev) if done else None)
            else:
                st, r = srv.post("/v1/completions", body)
                results[i] = (st, r["choices"][0]["text"], r["choices"][0]["finish_reason"])
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = (0, repr(e), None)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    wrong = [i for i, r in enumerate(results)
             if r != (200, refs[PROMPTS[i % len(PROMPTS)]]["text"], refs[PROMPTS[i % len(PROMPTS)]]["finish_reason"])]
    return wrong, results


def n_choices(srv, model, failures):
    """OpenAI's n: independent draws, choice j with seed + j (generate --num-samples' sample j)."""
    samples = json.loads(generate(model, "--prompt", "alpha", "--max-new-tokens", str(MAX_TOKENS), "--temperature",
                                  "0.9", "--seed", "5", "--num-samples", "3", "--json"))["samples"]
    want = [s["text"] for s in samples]
    body = {"prompt": "alpha", "max_tokens": MAX_TOKENS, "temperature": 0.9, "seed": 5, "n": 3}
    st, r = srv.post("/v1/completions", body)
    got = [(c["index"], c["text"]) for c in r.get("choices", [])]
    check(st == 200 and got == list(enumerate(want)) and len(set(want)) > 1,
          f"n = 3, seed 5: three choices, generate --num-samples 3 --seed 5's samples ({got})", failures)
    singles = [srv.post("/v1/completions", dict(body, n=1, seed=5 + j))[1] for j in range(3)]
    check([x["choices"][0]["text"] for x in singles] == want
          and r["usage"]["prompt_tokens"] == singles[0]["usage"]["prompt_tokens"]
          and r["usage"]["completion_tokens"] == sum(x["usage"]["completion_tokens"] for x in singles),
          f"n = 3: choice j is seed 5 + j's answer; the prompt counted once, the completions summed "
          f"({r['usage']})", failures)
    st, ev, done = srv.stream("/v1/completions", body)
    per = {}
    for e in ev:
        for c in e["choices"]:
            per[c["index"]] = per.get(c["index"], "") + c["text"]
    check(st == 200 and done and [per.get(i) for i in range(3)] == want, "n = 3 streamed: the same three texts",
          failures)
    st, r = srv.post("/v1/completions", dict(body, prompt=["alpha", "alpha"], n=1))
    texts = [c["text"] for c in r.get("choices", [])]
    check(st == 200 and texts == want[:2], f"the same prompt listed twice: two draws, seeds 5 and 6 ({texts})",
          failures)
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "alpha"}], "max_tokens": 8,
                                              "temperature": 0.9, "seed": 5, "n": 2})
    check(st == 200 and [c["index"] for c in r["choices"]] == [0, 1]
          and all(c["message"]["role"] == "assistant" for c in r["choices"]),
          f"chat with n = 2: two messages ({[c['message']['content'] for c in r.get('choices', [])]})", failures)


def concurrent(srv, refs, failures):
    steps0, rows0 = srv.metric("anvil_decode_steps_total"), srv.metric("anvil_decode_rows_total")
    passes0 = srv.metric("anvil_forward_passes_total")
    wrong, results = clients(srv, refs, 64)
    check(not wrong, f"64 concurrent clients (32 streaming) get their complete answers (wrong: {wrong[:5]} "
                     f"{[results[i] for i in wrong[:2]]})", failures)
    steps = srv.metric("anvil_decode_steps_total") - steps0
    rows = srv.metric("anvil_decode_rows_total") - rows0
    check(steps > 0 and rows / steps > 4, f"the decode steps were batched: {rows / max(steps, 1):.1f} sequences "
                                          f"per step on average", failures)
    passes = srv.metric("anvil_forward_passes_total") - passes0
    check(steps <= passes < steps + 64, f"the prompts went in beside the decode steps: {passes:.0f} forwards for "
                                        f"{steps:.0f} decode steps and 64 prompts", failures)


def bad_input(srv, failures):
    cases = [
        ("/v1/completions", '{"prompt": "x", ', 400, "malformed JSON"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "ten"}), 400, "max_tokens of the wrong type"),
        ("/v1/completions", json.dumps({"prompt": 12}), 400, "prompt of the wrong type"),
        ("/v1/completions", json.dumps({"max_tokens": 5}), 400, "missing prompt"),
        ("/v1/chat/completions", json.dumps({"max_tokens": 5}), 400, "missing messages"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}), 400, "max_tokens 0"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -3}), 400, "max_tokens < 0"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 100000}), 400, "max_tokens past the context"),
        ("/v1/completions", json.dumps({"prompt": "word " * 400}), 400, "a prompt longer than the context"),
        ("/v1/completions", json.dumps({"prompt": "x", "model": "gpt-4o"}), 404, "an unknown model"),
        ("/v1/completions", json.dumps({"prompt": "x", "n": 0}), 400, "n = 0"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}), 400,
         "an unknown role"),
        ("/v1/completions", json.dumps({"prompt": "x" * 30000}), 413, "a body over --max-body-mb"),
        ("/v1/nothing", json.dumps({"prompt": "x"}), 404, "an unknown path"),
    ]
    for path, raw, want, what in cases:
        status, text = srv.request("POST", path, raw=raw)
        try:
            err = json.loads(text)["error"]
            ok = isinstance(err["message"], str) and err["message"] and "type" in err
        except (ValueError, KeyError, TypeError):
            ok, err = False, text
        check(status == want and ok, f"{what}: {status} with an OpenAI error body ({str(err)[:120]})", failures)
    st, text = srv.request("GET", "/health")
    check(st == 200 and json.loads(text)["status"] == "ok", "the server keeps serving after bad input", failures)


def dropped_client(srv, failures, stream):
    """A client that leaves frees its sequence: mid-stream, or while it waits for the whole answer."""
    abandoned = 'anvil_generations_finished_total{reason="abandoned"}'
    abandoned0, tokens0 = srv.metric(abandoned), srv.metric("anvil_generation_tokens_total")
    body = json.dumps({"prompt": "alpha", "max_tokens": 200, "temperature": 0, "stream": stream})
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    got = b""
    while stream and b"data: " not in got:
        got += s.recv(4096)
    s.close()  # mid-stream, or before the answer
    deadline = time.time() + 10
    # abandoned first: the sequence may start running after a first look at the running count
    while time.time() < deadline and not (srv.metric(abandoned) > abandoned0
                                          and srv.metric("anvil_running_sequences") == 0):
        time.sleep(0.05)
    made = srv.metric("anvil_generation_tokens_total") - tokens0
    what = "mid-stream" if stream else "before its whole answer"
    check(srv.metric("anvil_running_sequences") == 0 and srv.metric(abandoned) == abandoned0 + 1 and made < 200,
          f"a client that drops {what} frees its sequence (counted as abandoned, {made:.0f} of 200 tokens made)",
          failures)


def small_pool(model, refs, failures):
    """A KV cache of one context (16 pages of 16 positions for this model) under 16 clients: the pages run out
    as the answers grow, the newest sequences are preempted and recomputed, and every answer is still
    generate's."""
    srv = Server(model, "--kv-cache-mb", "1")
    try:
        wrong, results = clients(srv, refs, 16)
        check(srv.saw("in 16 pages of 16 positions"),
              f"--kv-cache-mb 1 buys 16 pages: {''.join(srv.lines).strip()}", failures)
        check(not wrong, f"16 clients in a pool of 16 pages get generate's answers (wrong: {wrong[:5]} "
                         f"{[results[i] for i in wrong[:2]]})", failures)
        pre = srv.metric("anvil_preemptions_total")
        check(pre > 0, f"sequences were preempted and recomputed: {pre:.0f}", failures)
        check(srv.metric("anvil_kv_cache_usage_ratio") == 0, "every page back in the pool", failures)
    finally:
        srv.stop()


SHARED = "the same system prompt opens every request, so its pages are filled once: " * 2


def shared_prefix(srv, model, failures, on=True):
    """Prompts that begin with the same 28 words: after the first, each takes the pages it filled from the
    cache (prefix caching on) and prefills only its own end; the answers are generate's either way."""
    shared = reference(model, SHARED, 1)["prompt_tokens"] - 1  # the last may merge with what follows
    hits0, asked0 = srv.metric("anvil_prefix_cache_hits_total"), srv.metric("anvil_prefix_cache_queries_total")
    for end in ("alpha", "gamma delta", "alpha"):
        p = SHARED + end
        ref = reference(model, p)
        st, r = srv.post("/v1/completions", {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0})
        check(st == 200 and r["choices"][0]["text"] == ref["text"],
              f"a prompt after the shared one ({end!r}, prefix cache {'on' if on else 'off'}) gets generate's "
              f"answer" + ("" if st == 200 else f" ({st}: {r})"), failures)
    hits = srv.metric("anvil_prefix_cache_hits_total") - hits0
    asked = srv.metric("anvil_prefix_cache_queries_total") - asked0
    if on:  # the shared prompt's whole pages for each of the last two
        check(hits >= 2 * (shared // 16) * 16 > 0, f"prefix cache: {hits:.0f} of {asked:.0f} prompt positions found", failures)
    else:
        check(hits == 0 and asked > 0, f"--prefix-cache off: {hits:.0f} of {asked:.0f} found", failures)


def queue_full(model, failures):
    srv = Server(model, "--max-batch", "1", "--max-queue", "0", "--prefix-cache", "off")
    try:
        long_body = {"prompt": "alpha", "max_tokens": 200, "temperature": 0}
        first = {}
        t = threading.Thread(target=lambda: first.update(zip(("st", "ev", "done"),
                                                              srv.stream("/v1/completions", long_body))))
        t.start()
        deadline = time.time() + 10
        while time.time() < deadline and srv.metric("anvil_running_sequences") < 1:
            time.sleep(0.01)
        st, r = srv.post("/v1/completions", {"prompt": "gamma", "max_tokens": 4})
        check(st == 429 and r["error"]["code"] == "rate_limit_exceeded",
              f"one slot, no queue: a second request gets 429 ({r.get('error', {}).get('message')})", failures)
        t.join(120)
        check(first.get("st") == 200 and first.get("done"), "the running request still completes", failures)
        shared_prefix(srv, model, failures, on=False)
    finally:
        srv.stop()


def api_keys(model, d, failures):
    """--api-key (twice), --api-key-file and ANVIL_API_KEY: no key, a wrong one and each right one; /health
    open, /metrics behind the keys unless --public-metrics; bad key input is a one-line error."""
    key_file = os.path.join(d, "keys.txt")
    with open(key_file, "w") as f:
        f.write("# the team's keys\n\nsk-file-key\n")
    env = dict(os.environ, ANVIL_API_KEY="sk-env-key")
    srv = Server(model, "--api-key", "sk-one", "--api-key", "sk-two", "--api-key-file", key_file, env=env)
    try:
        check(srv.saw("4 API keys"), "the server says it has 4 API keys", failures)
        body = {"prompt": "alpha", "max_tokens": 2, "temperature": 0}
        for name, headers in (("no key", {}), ("a wrong key", {"Authorization": "Bearer sk-onf"}),
                              ("a key's prefix", {"Authorization": "Bearer sk-on"}),
                              ("a key without Bearer", {"Authorization": "sk-one"})):
            st, text = srv.request("POST", "/v1/completions", body, headers=headers)
            err = json.loads(text).get("error", {})
            check(st == 401 and err.get("code") == "invalid_api_key" and err.get("type") == "invalid_request_error",
                  f"{name}: 401 in OpenAI's error shape ({st}: {err.get('message')})", failures)
        for key in ("sk-one", "sk-two", "sk-file-key", "sk-env-key"):
            st, text = srv.request("POST", "/v1/completions", body, headers={"Authorization": "Bearer " + key})
            check(st == 200 and json.loads(text)["choices"], f"key {key}: 200 and an answer", failures)
        st, _ = srv.request("GET", "/health")
        check(st == 200, "/health needs no key", failures)
        st, _ = srv.request("GET", "/metrics")
        check(st == 401, "/metrics needs a key", failures)
        st, _ = srv.request("GET", "/nowhere")
        check(st == 401, "an unknown path without a key says 401, not 404", failures)
        st, text = srv.request("GET", "/metrics", headers={"Authorization": "Bearer sk-two"})
        check(st == 200 and 'status="401"' in text, "/metrics with a key counts the 401s", failures)
    finally:
        srv.stop()
    srv = Server(model, "--api-key", "sk-one", "--public-metrics")
    try:
        st, _ = srv.request("GET", "/metrics")
        check(st == 200, "--public-metrics: /metrics needs no key", failures)
    finally:
        srv.stop()
    for args, env_key, want in ((["--api-key-file", os.path.join(d, "missing.txt")], None, "no such file"),
                                (["--api-key", ""], None, "empty API key"),
                                (["--api-key", "two words"], None, "one printable word"),
                                ([], " , ", "holds no key")):
        env = dict(os.environ)
        if env_key is not None:
            env["ANVIL_API_KEY"] = env_key
        r = subprocess.run([ANVIL, "serve", "--model", model, "--port", "0", *args], capture_output=True, text=True,
                           env=env, timeout=60)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0 and len(lines) == 1 and want in lines[0],
              f"bad key input {args or env_key!r}: a one-line error ({r.stderr.strip()})", failures)


def slow_clients(model, refs, failures):
    """160 connections that send their request a byte every half second (more than the handler threads
    cpp-httplib's pool had) hold a connection each and nothing else: requests beside them get generate's
    answers while all 160 are open; each is then cut off with 408 at --request-timeout. An idle connection is
    closed at --idle-timeout; past --max-connections a new one gets 503, and once some close, 200 again."""
    srv = Server(model, "--request-timeout", "4", "--idle-timeout", "2", "--max-connections", "170")
    slow, answers, stop = [], {}, threading.Event()
    try:
        idle = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        for _ in range(160):
            slow.append(socket.create_connection(("127.0.0.1", srv.port), timeout=30))
        request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"{" * 100

        def drip():
            for k in range(len(request)):
                if stop.wait(0.5):
                    return
                for c in slow:
                    try:
                        c.send(request[k:k + 1])
                    except OSError:
                        pass

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        time.sleep(0.6)  # the first bytes are in: each slow connection is inside its request
        opened = srv.metric("anvil_open_connections")
        started = time.time()
        for p in PROMPTS[:4]:
            st, r = srv.post("/v1/completions", {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0})
            answers[p] = (st, r["choices"][0]["text"] if st == 200 else r)
        took = time.time() - started
        still = srv.metric("anvil_open_connections")
        check(opened >= 161 and still >= 161,
              f"the slow connections are open while the others are served ({opened:.0f}, then {still:.0f} open)",
              failures)
        check(all(answers[p] == (200, refs[p]["text"]) for p in answers),
              f"requests beside 160 slow connections get generate's answers ({took:.1f} s for 4)", failures)
        cut = []
        for c in slow:
            try:
                c.settimeout(30)
                cut.append(c.recv(4096).decode("utf-8", "replace"))
            except OSError as e:
                cut.append(repr(e))
        ok = [x for x in cut if x.startswith("HTTP/1.1 408") and "--request-timeout" in x]
        check(len(ok) == 160, f"each slow connection is cut off with 408 and an OpenAI error body at "
                              f"--request-timeout ({len(ok)} of 160; {cut[0][:60]!r})", failures)
        idle.settimeout(30)
        check(idle.recv(10) == b"", "an idle connection is closed at --idle-timeout", failures)
        stop.set()
        for c in slow + [idle]:
            c.close()
        # --max-connections: 170 idle connections fill it; the next gets 503
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(170)]
        deadline = time.time() + 10
        while time.time() < deadline:
            st, text = srv.request("GET", "/health")
            if st == 503:
                break
            time.sleep(0.05)  # the server may not have taken all 170 in yet
        err = json.loads(text).get("error", {})
        check(st == 503 and "--max-connections" in err.get("message", ""),
              f"past --max-connections: 503 with an OpenAI error body ({st}: {err.get('message')})", failures)
        for c in held:
            c.close()
        deadline = time.time() + 10
        while time.time() < deadline and srv.request("GET", "/health")[0] != 200:
            time.sleep(0.05)
        st, _ = srv.request("GET", "/health")
        check(st == 200, "once connections close, new ones are served again", failures)
    finally:
        stop.set()
        srv.stop()


def drain(model, failures):
    srv = Server(model, "--drain-seconds", "60")
    long_body = {"prompt": "alpha", "max_tokens": 200, "temperature": 0}
    ref = reference(model, "alpha", 200)
    got = {}
    t = threading.Thread(target=lambda: got.update(zip(("st", "r"), srv.post("/v1/completions", long_body))))
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline and srv.metric("anvil_running_sequences") < 1:
        time.sleep(0.01)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    try:
        st, text = srv.request("POST", "/v1/completions", raw=json.dumps({"prompt": "x", "max_tokens": 2}))
        late = st
    except (ConnectionError, OSError):
        late = "refused"
    t.join(120)
    rc = srv.stop(timeout=60)
    check(got.get("st") == 200 and got["r"]["choices"][0]["text"] == ref["text"],
          "SIGTERM: the running request finishes with its whole answer", failures)
    check(late in (503, "refused"), f"SIGTERM: a new request is refused ({late})", failures)
    check(rc == 0, f"SIGTERM: the server exits 0 after draining (exit {rc}; {''.join(srv.lines[-2:]).strip()})",
          failures)


def npm_openai():
    root = os.path.join(NPM_CACHE, "openai")
    if os.path.exists(os.path.join(root, "node_modules", "openai", "package.json")):
        return root, None
    if not shutil.which("node") or not shutil.which("npm"):
        return None, "node and npm are needed (apt-get install nodejs npm)"
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "package.json"), "w") as f:
        json.dump({"name": "anvil-openai-check", "version": "1.0.0", "private": True, "type": "module"}, f)
    r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "openai"], cwd=root, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        return None, f"npm install openai failed: {r.stderr.strip()[-300:]}"
    return root, None


def openai_client(srv, model, name, refs, failures):
    root, why = npm_openai()
    if root is None:
        print(f"SKIPPED: the OpenAI client part: {why}")
        return
    script = os.path.join(root, "client.mjs")  # beside its node_modules, so the import resolves
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_client.mjs"), script)
    p = PROMPTS[0]
    r = subprocess.run(["node", script, f"http://127.0.0.1:{srv.port}/v1", name, p, str(MAX_TOKENS)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        check(False, f"the OpenAI client ran: {r.stderr[-600:]}", failures)
        return
    out = json.loads(r.stdout)
    ref = refs[p]
    usage = {"prompt_tokens": ref["prompt_tokens"], "completion_tokens": ref["completion_tokens"],
             "total_tokens": ref["prompt_tokens"] + ref["completion_tokens"]}
    check(out["models"] == [name], f"openai: models.list() gives {out['models']}", failures)
    check(out["completion"] == {"text": ref["text"], "finish": ref["finish_reason"], "usage": usage},
          f"openai: completions.create() text, finish_reason and usage ({out['completion']})", failures)
    check(out["streamed"] == {"text": ref["text"], "finish": ref["finish_reason"], "usage": usage},
          "openai: streamed completion equals the plain one, usage in the last chunk", failures)
    chat_ref = generate(model, "--chat", "--prompt", p, "--max-new-tokens", str(MAX_TOKENS), "--temperature", "0")
    chat_ref = chat_ref[:-1] if chat_ref.endswith("\n") else chat_ref
    check(out["chat"]["role"] == "assistant" and out["chat"]["text"] == chat_ref
          and out["chat"]["usage"]["completion_tokens"] > 0,
          f"openai: chat.completions.create() equals generate --chat ({out['chat']['text']!r})", failures)
    check(out["chatStreamed"] == {"role": "assistant", "text": chat_ref}, "openai: streamed chat equals the plain one",
          failures)
    check(isinstance(out["unknownModel"], dict) and out["unknownModel"]["status"] == 404,
          f"openai: an unknown model is a 404 APIError ({out['unknownModel']})", failures)


def main():
    failures = []
    with common.TempDir() as d:
        data = common.text_file(d, "d.txt", 30000)
        run(["train", "--data", data, "--out", os.path.join(d, "servetest"), "--steps", "40", "--layers", "4",
             "--heads", "4", "--dim", "128", "--seq", "256", "--batch", "4", "--threads", "2"], check=True, timeout=600)
        model = os.path.join(d, "servetest", "final")
        refs = {p: reference(model, p) for p in PROMPTS}
        srv = Server(model, "--max-body-mb", "0.02")
        try:
            st, text = srv.request("GET", "/health")
            check(st == 200 and json.loads(text) == {"status": "ok"}, "GET /health", failures)
            st, text = srv.request("GET", "/v1/models")
            models = json.loads(text)
            check(st == 200 and models["data"][0]["id"] == "servetest" and models["object"] == "list",
                  f"GET /v1/models lists the run's name: {models['data'][0]['id']}", failures)
            same_answers(srv, model, refs, failures)
            concurrent(srv, refs, failures)
            bad_input(srv, failures)
            dropped_client(srv, failures, stream=True)
            dropped_client(srv, failures, stream=False)
            openai_client(srv, model, "servetest", refs, failures)
            shared_prefix(srv, model, failures)
            st, text = srv.request("GET", "/metrics")
            for name in ("anvil_requests_total", "anvil_time_to_first_token_seconds_bucket",
                         "anvil_inter_token_latency_seconds_count", "anvil_queue_length", "anvil_running_sequences",
                         "anvil_kv_cache_usage_ratio", "anvil_kv_cache_pages", "anvil_preemptions_total",
                         "anvil_prefix_cache_hits_total", "anvil_kv_cache_cached_pages",
                         "anvil_generation_tokens_total"):
                check(name in text, f"/metrics has {name}", failures)
        finally:
            rc = srv.stop()
        check(rc == 0, f"the server exits 0 on SIGTERM (exit {rc})", failures)
        small_pool(model, refs, failures)
        queue_full(model, failures)
        api_keys(model, d, failures)
        slow_clients(model, refs, failures)
        drain(model, failures)
    return common.report(failures)


if __name__ == "__main__":
    sys.exit(main())
