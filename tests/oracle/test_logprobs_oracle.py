#!/usr/bin/env python3
"""Oracle test for the server's log-probabilities (OpenAI's logprobs, top_logprobs and echo): this
repository's own GPT-2 in PyTorch (test_torch_oracle.py, Debian's python3-torch) computes log-softmax of the
same HF-layout weights' logits, and `anvil serve` must report the same values within 1e-4.

- echo with max_tokens 0 (scoring a text, as lm-eval-harness's loglikelihood requests do): every prompt token
  after the first has its log-probability and its top-5, the first has null; in prefill pieces of 16, also
  when the prompt's pages are already in the prefix cache from an earlier request, and with requests
  scored side by side in one batch;
- echo with max_tokens 1 at temperature 0 (lm-eval's exact request): the prompt's values, then the greedy token
  and its value; several prompts of ids in one request (lm-eval's batches), a choice each;
- generated tokens: each one's log-probability under the model given everything before it, the raw model's
  even when penalties change the sampling; streamed chunks carry the same values as the whole response;
- chat: top_logprobs entries, bytes (the byte tokenizer's token N is byte N), the greedy token first among them;
  streamed the same.

Skips (exit 77) without torch.
"""
import json
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(__file__))
import test_torch_oracle as o  # noqa: E402  (skips with exit 77 when torch is missing)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serve"))
from test_serve import Server  # noqa: E402  (anvil serve on a free port, driven over HTTP)
import common  # noqa: E402  (tests/cli/common.py, on the path test_serve set)

torch = o.torch
TOL = 1e-4


def torch_lp(p, ids):
    """log-softmax of the model's logits at every position of ids: (T, V), double."""
    with torch.no_grad():
        return torch.log_softmax(o.forward(p, torch.tensor([ids])).double(), dim=-1)[0]


def near(a, b):
    return a is not None and abs(a - b) <= TOL  # None (JSON null) never passes


def check_top(top, lp_row, k, failures, what, by_id=False):
    """top: {text (or "token_id:N"): logprob} of the k likeliest and the token itself; lp_row: torch's (V)."""
    if not isinstance(top, dict):
        failures.append(f"{what}: top_logprobs is {top!r}")
        return
    want = torch.topk(lp_row, k)
    for v, i in zip(want.values.tolist(), want.indices.tolist()):
        t = f"token_id:{i}" if by_id else chr(i) if i < 128 else None
        if t is not None and not near(top.get(t), v):
            failures.append(f"{what}: top entry {t!r} is {top.get(t)}, torch {v:.6f}")
            return


def check_echo(srv, p, ids, failures, what, chunks=None):
    st, r = srv.post("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 5, "max_tokens": 0})
    if st != 200:
        failures.append(f"{what}: HTTP {st}: {r}")
        return
    lp = r["choices"][0]["logprobs"]
    want = torch_lp(p, ids)
    errs = [abs(lp["token_logprobs"][k] - float(want[k - 1, ids[k]])) if lp["token_logprobs"][k] is not None
            else float("inf") for k in range(1, len(ids))]
    worst = max(errs)
    print(f"[{what}] {len(ids)} prompt tokens scored: worst |anvil - torch| {worst:.2e}")
    if len(lp["tokens"]) != len(ids) or lp["token_logprobs"][0] is not None or lp["top_logprobs"][0] is not None:
        failures.append(f"{what}: {len(lp['tokens'])} tokens for {len(ids)}; the first's value "
                        f"{lp['token_logprobs'][0]} (null expected)")
    if not worst <= TOL:
        failures.append(f"{what}: prompt log-probabilities differ from torch's by up to {worst:.2e}")
    for k in range(1, len(ids), 7):
        check_top(lp["top_logprobs"][k], want[k - 1], 5, failures, f"{what}, position {k}")
    if lp["text_offset"] != list(range(len(ids))):
        failures.append(f"{what}: text offsets {lp['text_offset'][:8]}..., expected 0, 1, 2, ...")
    c = r["choices"][0]
    if c["text"] != bytes(ids).decode() or c["finish_reason"] != "length" or r["usage"]["completion_tokens"] != 0:
        failures.append(f"{what}: text {c['text']!r}, finish {c['finish_reason']}, usage {r['usage']}")


def main():
    failures = []
    g = torch.Generator().manual_seed(5)
    prompt = lambda n: [int(x) for x in torch.randint(32, 127, (n,), generator=g)]  # noqa: E731  printable bytes
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "lp")
        p = o.make_params()
        o.write_model(model_dir, p)
        # the byte tokenizer (the oracle's ids are bytes); compact chat prompts fit 64 positions
        srv = Server(model_dir, "--tokenizer", "byte", "--prefill-chunk", "16", "--template", "compact")
        try:
            ids = prompt(50)
            check_echo(srv, p, ids, failures, "echo, max_tokens 0")
            # the same prompt again: its pages are in the prefix cache now, and scoring must not take them
            check_echo(srv, p, ids, failures, "echo, prompt in the prefix cache")
            # several scored side by side in the scheduler's batches
            prompts, threads = [prompt(20 + 9 * i) for i in range(4)], []
            for i, q in enumerate(prompts):
                threads.append(threading.Thread(target=check_echo, args=(srv, p, q, failures, f"echo, batched {i}")))
                threads[-1].start()
            for t in threads:
                t.join()

            # lm-eval-harness's loglikelihood request: echo, logprobs 1, max_tokens 1, temperature 0
            ids = prompt(30)
            st, r = srv.post("/v1/completions", {"prompt": [ids], "echo": True, "logprobs": 1, "max_tokens": 1,
                                                 "temperature": 0})
            lp = r["choices"][0]["logprobs"]
            want = torch_lp(p, ids)
            greedy = int(want[-1].argmax())
            got = lp["token_logprobs"]
            if st != 200 or len(got) != len(ids) + 1 or not near(got[-1], float(want[-1, greedy])) or \
                    not all(near(got[k], float(want[k - 1, ids[k]])) for k in range(1, len(ids))):
                failures.append(f"lm-eval request: HTTP {st}, {len(got)} values for {len(ids)} + 1 tokens")
            # is_greedy as lm-eval decides it (the token's value against the largest of its top_logprobs): the
            # largest is torch's likeliest token's at every position
            if not all(near(max(lp["top_logprobs"][k].values()), float(want[k - 1].max())) for k in range(1, len(ids))):
                failures.append("lm-eval request: the top of a position's top_logprobs is not torch's likeliest")

            # echo streamed with max_tokens 0: one event holds the scored prompt, then the end
            st, events, _ = srv.stream("/v1/completions", {"prompt": [ids], "echo": True, "logprobs": 1,
                                                           "max_tokens": 0})
            chunks = [e["choices"][0] for e in events if e["choices"]]
            got = [v for c in chunks if c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
            if st != 200 or len(got) != len(ids) or chunks[-1]["finish_reason"] != "length" or \
                    not all(near(got[k], float(want[k - 1, ids[k]])) for k in range(1, len(ids))):
                failures.append(f"echo streamed, max_tokens 0: HTTP {st}, {len(got)} values for {len(ids)} tokens")

            # lm-eval with batch_size > 1: several prompts of ids in one request, a choice each
            batch = [prompt(12), prompt(25), prompt(7)]
            st, r = srv.post("/v1/completions", {"prompt": batch, "echo": True, "logprobs": 1, "max_tokens": 0})
            worst = 0.0
            for i, c in enumerate(r.get("choices", [])):
                want = torch_lp(p, batch[i])
                got = c["logprobs"]["token_logprobs"]
                if c["index"] != i or len(got) != len(batch[i]):
                    failures.append(f"batched prompts: choice {i} has index {c['index']}, {len(got)} values")
                    continue
                worst = max([worst] + [abs(got[k] - float(want[k - 1, batch[i][k]])) for k in range(1, len(got))])
            print(f"[echo, 3 prompts in one request] worst |anvil - torch| {worst:.2e}")
            if st != 200 or len(r["choices"]) != 3 or not worst <= TOL:
                failures.append(f"batched prompts: HTTP {st}, {len(r.get('choices', []))} choices, worst {worst:.2e}")

            # generated tokens, greedy and sampled with penalties: the raw model's values
            ids = prompt(20)
            for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 3, "presence_penalty": 1.5,
                                               "frequency_penalty": 1.0}):
                # tokens named by id (vLLM's extension): a byte past ASCII has no text of its own
                body = dict({"prompt": ids, "max_tokens": 10, "logprobs": 3, "return_tokens_as_token_ids": True},
                            **extra)
                st, r = srv.post("/v1/completions", body)
                lp = r["choices"][0]["logprobs"]
                gen = [int(t[len("token_id:"):]) for t in lp["tokens"]]
                worst = 0.0
                for i, t in enumerate(gen):
                    row = torch_lp(p, ids + gen[:i])[-1]
                    worst = max(worst, abs(lp["token_logprobs"][i] - float(row[t])))
                    if extra["temperature"] == 0 and t != int(row.argmax()):
                        failures.append(f"greedy token {i} is {t}, torch's argmax {int(row.argmax())}")
                    check_top(lp["top_logprobs"][i], row, 3, failures, f"generated token {i} {extra}", by_id=True)
                print(f"[generated {extra}] {len(gen)} tokens: worst |anvil - torch| {worst:.2e}")
                if st != 200 or len(gen) != r["usage"]["completion_tokens"] or not worst <= TOL:
                    failures.append(f"generated tokens {extra}: HTTP {st}, {len(gen)} values, worst {worst:.2e}")
                if lp["text_offset"][0] != len(ids):
                    failures.append(f"the first generated token's offset is {lp['text_offset'][0]}, not {len(ids)}")
                # streamed: the chunks' values, in order, are the whole response's
                st, events, _ = srv.stream("/v1/completions", body)
                streamed = [v for e in events if e["choices"] and e["choices"][0]["logprobs"]
                            for v in e["choices"][0]["logprobs"]["token_logprobs"]]
                if streamed != lp["token_logprobs"]:
                    failures.append(f"streamed values {streamed} differ from the whole response's")
                # echo streamed: the first event leads with the prompt's text and values
                echo = dict(body, echo=True)
                st, r = srv.post("/v1/completions", echo)
                st2, events, _ = srv.stream("/v1/completions", echo)
                chunks = [e["choices"][0] for e in events if e["choices"]]
                text = "".join(c["text"] for c in chunks)
                streamed = [v for c in chunks if c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
                whole = r["choices"][0]
                if st != 200 or st2 != 200 or text != whole["text"] or \
                        streamed != whole["logprobs"]["token_logprobs"] or len(streamed) != len(ids) + len(gen) or \
                        chunks[0]["logprobs"]["text_offset"][:len(ids)] != whole["logprobs"]["text_offset"][:len(ids)]:
                    failures.append(f"echo streamed {extra}: HTTP {st2}, {len(streamed)} values, text "
                                    f"{text[:60]!r} against {whole['text'][:60]!r}")

            # chat: top_logprobs and bytes; at temperature 0 each token is the first of its top_logprobs
            body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2,
                    "max_tokens": 6, "temperature": 0, "return_tokens_as_token_ids": True}
            st, r = srv.post("/v1/chat/completions", body)
            content = r["choices"][0]["logprobs"]["content"]
            ok = st == 200 and len(content) == r["usage"]["completion_tokens"] and all(
                len(c["top_logprobs"]) == 2 and c["bytes"] == [int(c["token"][len("token_id:"):])] and
                c["top_logprobs"][0]["token"] == c["token"] and c["top_logprobs"][0]["logprob"] == c["logprob"] and
                c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"] for c in content)
            if not ok:
                failures.append(f"chat logprobs: HTTP {st}: {json.dumps(r)[:400]}")
            st, events, _ = srv.stream("/v1/chat/completions", body)
            streamed = [c for e in events if e["choices"] and e["choices"][0]["logprobs"]
                        for c in e["choices"][0]["logprobs"]["content"]]
            if streamed != content:
                failures.append("chat: the streamed logprobs differ from the whole response's")
        finally:
            rc = srv.stop()
        if rc not in (0, -15):
            failures.append(f"the server exited {rc}:\n" + "".join(srv.lines[-20:]))
    return common.report(failures, "PASSED: anvil serve's log-probabilities agree with the PyTorch oracle within 1e-4")


if __name__ == "__main__":
    sys.exit(main())
