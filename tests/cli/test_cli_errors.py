#!/usr/bin/env python3
"""Bad input gets a clear one-line error and a non-zero exit: never a crash, a hang or silence.

Each case runs the real binary with a timeout; it must exit with a status of 1 or 2 (not killed by a
signal), print a last stderr line of the form `anvil <cmd>: error: <message>`, and that message must
contain the words that say what is wrong.
"""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import ONE_LINE_ERROR, TINY, TempDir, instruction_file, report, run, text_file, tiny_model  # noqa: E402


def main():
    failures = []

    def case(name, args, needle, timeout=60):
        try:
            r = run(args, timeout=timeout)
        except Exception as e:  # a hang shows up as a timeout
            failures.append(f"{name}: {e}")
            return
        lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
        last = lines[-1] if lines else ""
        problems = []
        if r.returncode not in (1, 2):
            problems.append(f"exit status {r.returncode}")
        if not ONE_LINE_ERROR.match(last):
            problems.append(f"last stderr line is not a one-line error: {last!r}")
        if needle.lower() not in last.lower():
            problems.append(f"message lacks {needle!r}: {last!r}")
        for bad in ("terminate called", "Segmentation", "Aborted", "core dumped", "what():"):
            if bad in r.stderr:
                problems.append(f"crash output: {bad}")
        status = "ok  " if not problems else "FAIL"
        print(f"{status} {name}: {last}")
        if problems:
            failures.append(f"{name}: " + "; ".join(problems))

    with TempDir() as d:
        good = text_file(d)
        model = tiny_model(d)
        out = lambda n: os.path.join(d, "out_" + n)  # noqa: E731

        # data files
        case("missing data file", ["train", "--data", os.path.join(d, "nope.txt"), "--out", out("a"), *TINY],
             "no such file")
        empty = os.path.join(d, "empty.txt")
        open(empty, "w").close()
        case("empty data file", ["train", "--data", empty, "--out", out("b"), *TINY], "empty")
        short = os.path.join(d, "short.txt")
        open(short, "w").write("tiny")
        case("data shorter than one sequence", ["train", "--data", short, "--out", out("c"), "--val-fraction", "0",
                                                *TINY], "fewer than one sequence")
        broken = os.path.join(d, "broken.jsonl")
        open(broken, "w").write('{"text": "fine"}\n{"text": "unterminated\n')
        case("broken JSON line", ["train", "--data", broken, "--out", out("d"), *TINY], "broken.jsonl:2")
        nofield = os.path.join(d, "nofield.jsonl")
        open(nofield, "w").write('{"body": "x"}\n')
        case("record without a text field", ["train", "--data", nofield, "--out", out("e"), *TINY], "nofield.jsonl:1")
        case("data path is a directory", ["train", "--data", d, "--out", out("f"), *TINY], "directory")
        case("unknown attention implementation", ["train", "--data", good, "--out", out("w"), "--attention", "fast",
                                                  *TINY], "--attention")
        case("bad logits chunk size", ["train", "--data", good, "--out", out("lc"), "--logits-chunk", "lots", *TINY],
             "--logits-chunk")
        case("unknown recompute mode", ["train", "--data", good, "--out", out("r"), "--recompute", "most", *TINY],
             "--recompute")
        case("vocabulary smaller than the tokenizer's", ["train", "--data", good, "--out", out("v"), "--vocab", "200",
                                                         *TINY], "--vocab 200")

        # checkpoints
        def broken_model(name, mutate):
            dst = os.path.join(d, name)
            shutil.copytree(model, dst)
            mutate(os.path.join(dst, "model.safetensors"), os.path.join(dst, "config.json"))
            return dst

        def truncate(st, cfg):
            size = os.path.getsize(st)
            with open(st, "r+b") as f:
                f.truncate(size // 2)

        def garbage(st, cfg):
            open(st, "wb").write(b"\x00\x01\x02not a safetensors file at all" * 10)

        def lying_header(st, cfg):
            raw = open(st, "rb").read()
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8:8 + n])
            name = "transformer.wte.weight"
            header[name]["shape"] = [header[name]["shape"][0] + 1, header[name]["shape"][1]]
            h = json.dumps(header).encode()
            open(st, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])

        def wrong_config(st, cfg):
            c = json.load(open(cfg))
            c["n_embd"] = 32
            json.dump(c, open(cfg, "w"))

        def empty_file(st, cfg):
            open(st, "wb").close()

        def directory(st, cfg):
            os.remove(st)
            os.mkdir(st)

        base = ["train", "--data", good, "--steps", "1", "--threads", "2"]
        case("truncated safetensors", [*base, "--init", broken_model("m1", truncate), "--out", out("g")], "truncated")
        case("garbage safetensors", [*base, "--init", broken_model("m2", garbage), "--out", out("h")], "safetensors")
        case("header lies about sizes", [*base, "--init", broken_model("m3", lying_header), "--out", out("i")],
             "header lies")
        case("shapes do not match the config", [*base, "--init", broken_model("m4", wrong_config), "--out", out("j")],
             "has shape")
        case("empty safetensors", [*base, "--init", broken_model("m5", empty_file), "--out", out("k")], "truncated")
        case("unreadable safetensors (a directory)", [*base, "--init", broken_model("m6", directory), "--out",
                                                      out("l")], "not a regular file")
        case("missing checkpoint directory", [*base, "--init", os.path.join(d, "none"), "--out", out("m")],
             "no such directory")
        case("context longer than the model's", [*base, "--init", model, "--seq", "64", "--out", out("n")],
             "longer than the model's context")
        case("resume from nothing", ["train", "--resume", os.path.join(d, "none")], "no such directory")
        case("resume from a model without training state", ["train", "--resume", d], "no training checkpoint")

        # sizes and flags
        for flag, value in (("--layers", "0"), ("--heads", "-2"), ("--dim", "0"), ("--seq", "0"), ("--batch", "-1"),
                            ("--steps", "0"), ("--grad-accum", "0"), ("--lr", "-0.1")):
            want = "--batch: must be a positive integer or auto" if flag == "--batch" else f"{flag}: must be positive"
            case(f"{flag} {value}", ["train", "--data", good, "--out", out("s"), flag, value], want)
        case("width not divisible by heads", ["train", "--data", good, "--out", out("t"), "--dim", "30", "--heads",
                                              "4"], "does not divide")
        case("unknown flag", ["train", "--data", good, "--bogus", "3"], "--bogus")
        # --config files
        def config(name, text):
            path = os.path.join(d, name)
            open(path, "w").write(text)
            return ["train", "--config", path, "--data", good, "--out", out(name), *TINY]
        case("config key that is no flag", config("c1.json", '{"layers": 2, "lrr": 3}'),
             'c1.json: "lrr" is not a flag of `anvil train`')
        case("config value the flag refuses", config("c2.json", '{"dropout": 1.5}'), 'c2.json: "dropout": --dropout')
        case("config value of the wrong type", config("c3.json", '{"layers": [2]}'),
             '"layers" must be a string, a number or true/false')
        case("config flag given a number", config("c4.json", '{"tie-embeddings": 1}'),
             '"tie-embeddings" is a flag: give true or false')
        case("config that is not JSON", config("c5.json", '{"layers": 2,}'), "c5.json: not valid JSON")
        case("config that is no object", config("c6.json", "[1, 2]"), "c6.json: expected a JSON object")
        nomodel = os.path.join(d, "c7.json")
        open(nomodel, "w").write('{"max-new-tokens": 4}')
        case("required flag in neither the config nor the command line", ["generate", "--config", nomodel, "--prompt",
                                                                          "x"], "--model is required: give it")
        case("missing config file", ["train", "--config", os.path.join(d, "none.json")], "--config")
        case("unknown subcommand", ["frobnicate"], "unknown command \"frobnicate\"")
        case("bad choice", ["train", "--data", good, "--shuffle", "maybe"], "--shuffle")
        case("non-numeric size", ["train", "--data", good, "--steps", "eight"], "--steps: must be a number")
        case("non-numeric batch", ["train", "--data", good, "--batch", "eight"], "positive integer or auto")
        case("bad memory limit", ["train", "--data", good, "--out", out("u"), "--memory-limit", "lots", *TINY],
             "--memory-limit lots")
        case("bad price", ["train", "--data", good, "--out", out("v"), "--price-per-hour", "cheap", *TINY],
             "--price-per-hour cheap")
        case("out dir already holds a run", ["train", "--data", good, "--out", os.path.dirname(model), *TINY],
             "already holds a run")
        case("early stop without evaluations", ["train", "--data", good, "--out", out("w"), "--early-stop", "3",
                                                *TINY], "give --eval-every")
        case("bad --keep-best", ["train", "--data", good, "--keep-best", "maybe"], "--keep-best")
        case("fp16 on the CPU", ["train", "--data", good, "--out", out("p16"), "--precision", "fp16", "--device", "cpu",
                                 *TINY], "--precision fp16: the CPU backend trains in fp32 (or bf16 products")
        case("outlier threshold no step can reach", ["train", "--data", good, "--out", out("z"), "--skip-loss-z",
                                                     "3", "--skip-window", "8", *TINY],
             "--skip-loss-z 3 can never be exceeded")
        case("early stop without a validation split", ["train", "--data", good, "--out", out("x"), "--early-stop",
                                                       "3", "--eval-every", "5", "--val-fraction", "0", *TINY],
             "no validation split")

        # eval / generate
        case("eval without --model", ["eval", "--data", good], "--model")
        case("--prompt and --prompt-file together", ["generate", "--model", model, "--prompt", "a", "--prompt-file",
                                                     good], "give --prompt or --prompt-file, not both")
        case("missing --prompt-file", ["generate", "--model", model, "--prompt-file", os.path.join(d, "none.txt")],
             "--prompt-file")
        case("eval of a missing model", ["eval", "--model", os.path.join(d, "none"), "--data", good],
             "no such directory")
        case("eval with --seq past the context", ["eval", "--model", model, "--data", good, "--seq", "999"],
             "longer than the model's context")
        case("generate with no prompt", ["generate", "--model", model], "--prompt")
        case("generate with a bad top-p", ["generate", "--model", model, "--prompt", "hi", "--top-p", "0"], "--top-p")
        case("generate with an unknown template", ["generate", "--model", model, "--instruction", "x", "--template",
                                                   "chatml"], "--template")
        inst = instruction_file(d)
        case("eval with a model whose vocabulary is too small",
             ["eval", "--model", broken_model("m7", lambda st, cfg: json.dump(
                 dict(json.load(open(cfg)), vocab_size=100), open(cfg, "w"))), "--data", inst], "vocabulary")

    return report(failures, "PASSED: every bad input gave a one-line error and a non-zero exit")


if __name__ == "__main__":
    sys.exit(main())
