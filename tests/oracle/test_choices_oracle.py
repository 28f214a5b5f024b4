#!/usr/bin/env python3
"""Oracle test for multiple-choice evaluation (HellaSwag): this repository's own GPT-2 in PyTorch
(test_torch_oracle.py, Debian's python3-torch) scores the same items from the same HF-layout weights by the
README's contract, and `anvil eval --choices` must agree on every ending's log-likelihood (within 1e-5
relative), every token count, every prediction and both accuracies.

The contract: the byte tokenizer's ids are the UTF-8 bytes; a row is the context's ids (the end-of-text id
alone for an empty context) then the ending's, with a space between them unless the context ends or the
ending starts with whitespace; a row longer than the context of 64 keeps its last 65 ids (64 inputs, 64
targets); an ending's log-likelihood is the sum of log-softmax over its ids that are targets; acc takes the
likeliest ending, acc_norm the likeliest per token, ties to the first.

Skips (exit 77) without torch.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import test_torch_oracle as o  # noqa: E402  (skips with exit 77 when torch is missing)

torch = o.torch
TOL = 1e-5


def row(ctx, ending):
    c = list(ctx.encode()) or [o.EOT]
    joined = not ctx or ctx[-1].isspace() or ending[0].isspace()
    return c, c + list((ending if joined else " " + ending).encode())


def torch_scores(p, item):
    logprob, tokens = [], []
    for ending in item["endings"]:
        c, ids = row(item["ctx"], ending)
        first = max(0, len(ids) - 1 - o.NCTX)
        w = torch.tensor([ids[first:]])
        with torch.no_grad():
            lp = torch.log_softmax(o.forward(p, w[:, :-1]).double(), dim=-1)[0]
        pos = [j for j in range(w.shape[1] - 1) if first + j + 1 >= len(c)]
        logprob.append(float(sum(lp[j, ids[first + j + 1]] for j in pos)))
        tokens.append(len(pos))
    argmax = lambda v: max(range(len(v)), key=lambda k: (v[k], -k))  # noqa: E731  (first of equal maxima)
    return logprob, tokens, argmax(logprob), argmax([a / n for a, n in zip(logprob, tokens)])


def items(rng):
    words = ["the", "cat", "sat", "on", "a", "mat", "GPU", "héllo", "日本", "🙂", "42", "\n", "."]
    phrase = lambda lo, hi: " ".join(rng.choice(words) for _ in range(int(rng.integers(lo, hi))))  # noqa: E731
    out = []
    for i in range(40):
        # contexts from empty to past the model's context of 64 (their start dropped); some end with a space
        ctx = "" if i == 0 else phrase(1, 25) + (" " if i % 7 == 0 else "")
        endings = [phrase(1, 6) for _ in range(2 + i % 4)]
        if i % 5 == 0:
            endings[0] = " " + endings[0]
        out.append({"ctx": ctx, "endings": endings, "label": int(rng.integers(0, len(endings)))})
    return out


def main():
    failures = []
    rng = o.np.random.default_rng(11)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        p = o.make_params()
        o.write_model(model_dir, p)
        data = items(rng)
        path = os.path.join(tmp, "items.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for it in data:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
        log = os.path.join(tmp, "scores.jsonl")
        out = json.loads(o.run([o.ANVIL, "eval", "--model", model_dir, "--tokenizer", "byte", "--device", "cpu",
                                "--threads", "2", "--choices", path, "--choices-log", log, "--batch", "5", "--json"]))
        got = [json.loads(line) for line in open(log)]
        if len(got) != len(data):
            failures.append(f"{len(got)} items scored, expected {len(data)}")
        worst, correct, correct_norm = 0.0, 0, 0
        for i, (it, a) in enumerate(zip(data, got)):
            logprob, tokens, pred, pred_norm = torch_scores(p, it)
            correct += pred == it["label"]
            correct_norm += pred_norm == it["label"]
            for k, (x, y) in enumerate(zip(a["logprob"], logprob)):
                worst = max(worst, o.rel(x, y))
                if not o.rel(x, y) <= TOL:
                    failures.append(f"item {i} ending {k}: log-likelihood anvil {x:.7f} torch {y:.7f}")
            if a["tokens"] != tokens or a["label"] != it["label"] or a["index"] != i:
                failures.append(f"item {i}: tokens {a['tokens']} (torch {tokens}), label {a['label']}, "
                                f"index {a['index']}")
            if (a["pred"], a["pred_norm"]) != (pred, pred_norm):
                failures.append(f"item {i}: predictions {a['pred']}, {a['pred_norm']} (torch {pred}, {pred_norm})")
        n = len(data)
        print(f"{n} items, {sum(len(it['endings']) for it in data)} endings: worst relative log-likelihood "
              f"difference {worst:.2e}")
        print(f"acc: anvil {out['mc_acc']:.4f} torch {correct / n:.4f}; acc_norm: anvil {out['mc_acc_norm']:.4f} "
              f"torch {correct_norm / n:.4f}")
        if out["mc_n"] != n or out["mc_acc"] != correct / n or out["mc_acc_norm"] != correct_norm / n:
            failures.append(f"accuracies differ: {out}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    print(f"PASSED: anvil's multiple-choice scores agree with the PyTorch oracle within {TOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
