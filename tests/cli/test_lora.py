#!/usr/bin/env python3
"""LoRA fine-tuning from the command line: PEFT's files out and in, frozen base, resume bit for bit, eval and
generate with --adapter, merge equal to base + adapter, continuing an adapter PEFT wrote, sweeps, and every
bad input as a one-line error that writes nothing."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import ONE_LINE_ERROR, TempDir, check, report, run, text_file  # noqa: E402

SMALL = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq", "32", "--threads", "2"]


def safetensors_header(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path, tensors):
    """tensors: name -> (shape, list of floats), F32, written here independently of anvil."""
    header, blob, off = {}, b"", 0
    for name, (shape, values) in tensors.items():
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        blob += data
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def losses(run_dir):
    return {r["step"]: r["loss"] for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))}


def one_line_error(r, needle, what, f):
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    check(r.returncode == 1 and ONE_LINE_ERROR.match(msg) is not None and needle in msg,
          f"{what}: one-line error naming {needle!r} ({msg[:160]})", f)


def main():
    f = []
    with TempDir() as d:
        data = text_file(d, "corpus.txt", n_words=20000)
        base_run = os.path.join(d, "base")
        run(["train", "--data", data, "--out", base_run, "--steps", "30", "--batch", "4", *SMALL], check=True)
        base = os.path.join(base_run, "final")
        common = ["--init", base, "--data", data, "--lora-alpha", "8", "--batch", "4", "--threads", "2", "--lr",
                  "3e-3", "--log-every", "1", "--shuffle", "off"]
        lora = [*common, "--lora-rank", "4", "--lora-targets", "c_attn,c_proj"]

        # 1. a LoRA run: PEFT's files, only the adapters trained and saved
        a = os.path.join(d, "lora_a")
        run(["train", *lora, "--steps", "6", "--save-every", "3", "--keep-checkpoints", "0", "--out", a],
            check=True)
        final = os.path.join(a, "final")
        names = sorted(os.listdir(final))
        check({"adapter_config.json", "adapter_model.safetensors"} <= set(names) and "model.safetensors" not in names,
              f"a LoRA checkpoint holds PEFT's files and no copy of the base ({names})", f)
        cfg = json.load(open(os.path.join(final, "adapter_config.json")))
        want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8.0, "fan_in_fan_out": True,
                "bias": "none", "use_rslora": False, "target_modules": ["c_attn", "c_proj"]}
        check(all(cfg.get(k) == v for k, v in want.items()) and os.path.isabs(cfg["base_model_name_or_path"]),
              f"adapter_config.json has PEFT's keys ({ {k: cfg.get(k) for k in want} })", f)
        hdr, _ = safetensors_header(os.path.join(final, "adapter_model.safetensors"))
        ok = hdr.get("base_model.model.transformer.h.1.attn.c_attn.lora_A.weight", {}).get("shape") == [4, 32] and \
            hdr.get("base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight", {}).get("shape") == [32, 4]
        tensors = [k for k in hdr if k != "__metadata__"]
        check(ok and len(tensors) == 2 * 2 * 3, f"PEFT's tensor names and shapes (A r x in, B out x r): {len(tensors)}", f)
        opt, _ = safetensors_header(os.path.join(final, "optimizer.safetensors"))
        check(all("lora_" in k for k in opt if k != "__metadata__"), "optimizer state only for the adapters", f)
        s = json.load(open(os.path.join(a, "summary.json")))
        check(0 < s["trainable_params"] < s["params"] / 10, f"trainable {s['trainable_params']} of {s['params']}", f)

        # 2. resume bit for bit
        b = os.path.join(d, "lora_b")
        run(["train", "--resume", os.path.join(a, "checkpoint-3"), "--out", b], check=True)
        la, lb = losses(a), losses(b)
        check(sorted(lb) == [4, 5, 6] and all(lb[k] == la[k] for k in lb), f"resumed losses equal ({lb} vs {la})", f)
        check(open(os.path.join(a, "final", "adapter_model.safetensors"), "rb").read() ==
              open(os.path.join(b, "final", "adapter_model.safetensors"), "rb").read(), "resumed adapter identical", f)

        # 3. eval, generate and merge
        ev = ["eval", "--data", data, "--max-batches", "4", "--json"]
        e_base = json.loads(run([*ev, "--model", base], check=True).stdout)["loss"]
        e_lora = json.loads(run([*ev, "--model", base, "--adapter", final], check=True).stdout)["loss"]
        e_run = json.loads(run([*ev, "--model", a], check=True).stdout)["loss"]
        check(e_lora != e_base and e_run == e_lora, f"eval with the adapter ({e_lora:.5f}; base {e_base:.5f})", f)
        merged = os.path.join(d, "merged")
        run(["lora", "merge", "--model", base, "--adapter", final, "--out", merged], check=True)
        e_merged = json.loads(run([*ev, "--model", merged], check=True).stdout)["loss"]
        check(abs(e_merged - e_lora) <= 1e-5 * abs(e_lora),
              f"merged model's loss equals base + adapter within 1e-5 ({e_merged:.7f} vs {e_lora:.7f})", f)
        g = run(["generate", "--model", a, "--prompt", "alpha", "--max-new-tokens", "8", "--temperature", "0"])
        check(g.returncode == 0 and g.stdout.startswith("alpha"), "generate --model LORA_RUN loads base + adapter", f)

        # 4. continue an adapter as PEFT writes it: non-zero A and B, the adapter name in the tensor names
        peft = os.path.join(d, "peft")
        os.makedirs(peft)
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4, "lora_dropout": 0.0,
                   "target_modules": ["c_fc"], "fan_in_fan_out": True, "bias": "none", "base_model_name_or_path": base},
                  open(os.path.join(peft, "adapter_config.json"), "w"))
        tens = {}
        for l in range(2):
            p = f"base_model.model.transformer.h.{l}.mlp.c_fc."
            tens[p + "lora_A.default.weight"] = ([2, 32], [((i * 7 + l) % 11 - 5) * 0.02 for i in range(64)])
            tens[p + "lora_B.default.weight"] = ([128, 2], [((i * 5 + l) % 13 - 6) * 0.02 for i in range(256)])
        write_safetensors(os.path.join(peft, "adapter_model.safetensors"), tens)
        e_peft = json.loads(run([*ev, "--model", base, "--adapter", peft], check=True).stdout)["loss"]
        c = os.path.join(d, "continued")
        r = run(["train", "--adapter", peft, "--data", data, "--steps", "2", "--batch", "4", "--threads", "2",
                 "--out", c])
        ccfg = json.load(open(os.path.join(c, "final", "adapter_config.json"))) if r.returncode == 0 else {}
        check(r.returncode == 0 and e_peft != e_base and ccfg.get("r") == 2 and ccfg.get("target_modules") == ["c_fc"],
              f"train --adapter continues a PEFT adapter (its base from the config; eval {e_peft:.5f})", f)

        # 5. bad input: one line, exit 1, nothing written
        def bad(args, needle, what):
            out = os.path.join(d, "bad_" + str(len(f)) + "_" + needle[:6].replace("-", "").replace(" ", ""))
            r = run([*args, "--out", out] if args[0] == "train" else args)
            one_line_error(r, needle, what, f)
            check(not os.path.exists(out), f"{what}: nothing written", f)
        bad(["train", *common, "--lora-rank", "4", "--lora-targets", "q_proj", "--steps", "2"],
            "transformer.h.0.attn.c_attn", "a target naming no layer lists the layers")
        bad(["train", *common, "--lora-rank", "64", "--steps", "2"], "--lora-rank 64", "a rank larger than the layer")
        r = run(["train", *common, "--lora-rank", "-2", "--steps", "2", "--out", os.path.join(d, "neg")])
        check(r.returncode == 2 and "--lora-rank" in r.stderr and not os.path.exists(os.path.join(d, "neg")),
              "a negative rank is refused on the command line", f)
        bad(["train", "--data", data, "--lora-rank", "4", "--steps", "2"], "--init", "LoRA without a base")
        other = os.path.join(d, "other_base")
        run(["train", "--data", data, "--out", other, "--steps", "2", "--layers", "2", "--heads", "2", "--dim", "16",
             "--seq", "32", "--threads", "2"], check=True)
        bad(["train", "--init", os.path.join(other, "final"), "--adapter", final, "--data", data, "--steps", "2"],
            "another base model", "an adapter whose base shapes do not match")
        broken = os.path.join(d, "broken")
        os.makedirs(broken)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            open(os.path.join(broken, name), "wb").write(open(os.path.join(final, name), "rb").read())
        cfg_bad = dict(cfg, peft_type="IA3")
        json.dump(cfg_bad, open(os.path.join(broken, "adapter_config.json"), "w"))
        bad(["eval", "--model", base, "--adapter", broken, "--data", data], "peft_type", "an unknown peft_type")
        cfg_bad = dict(cfg)
        del cfg_bad["target_modules"]
        json.dump(cfg_bad, open(os.path.join(broken, "adapter_config.json"), "w"))
        bad(["eval", "--model", base, "--adapter", broken, "--data", data], "target_modules", "a missing field")
        json.dump(cfg, open(os.path.join(broken, "adapter_config.json"), "w"))
        raw = open(os.path.join(final, "adapter_model.safetensors"), "rb").read()
        open(os.path.join(broken, "adapter_model.safetensors"), "wb").write(raw[:len(raw) - 11])
        bad(["eval", "--model", base, "--adapter", broken, "--data", data], "truncated", "a truncated adapter file")
        full = os.path.join(d, "full")
        # --init takes a run directory as --model does: its final/
        run(["train", "--init", base_run, "--data", data, "--steps", "2", "--batch", "4", "--threads", "2",
             "--save-every", "1", "--out", full], check=True)
        init = json.load(open(os.path.join(full, "final", "trainer_state.json")))["options"].get("init", "")
        check(os.path.realpath(init) == os.path.realpath(base), f"train --init RUN_DIR starts from its final/ ({init})",
              f)
        r = run(["train", "--resume", full, "--adapter", final, "--steps", "3"])
        one_line_error(r, "--adapter", "--adapter with --resume of a run that had none", f)
        r = run(["sweep", "--grid", "lr=1e-3 lora_rnk=2,4", "--out", os.path.join(d, "badsweep"), "--", *common])
        one_line_error(r, "lora_rnk", "a sweep grid with an unknown flag", f)
        check(not os.path.exists(os.path.join(d, "badsweep")), "a bad sweep grid: nothing written", f)

        # 6. a sweep: every combination, one table, resumable
        sw = os.path.join(d, "sweep")
        sweep = ["sweep", "--grid", "lr=1e-3,3e-3 lora_rank=2,4", "--out", sw, "--", *common, "--lora-targets",
                 "c_attn", "--steps", "4", "--eval-every", "2"]
        r = run(sweep, timeout=300)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
        rows = [l.rstrip("\n").split(",") for l in open(os.path.join(sw, "sweep.csv"))] if r.returncode == 0 else [[]]
        header, body = rows[0], rows[1:]
        check(r.returncode == 0 and len(body) == 4 and header[:3] == ["run", "lr", "lora_rank"]
              and {"val_loss", "tokens_per_s", "wall_s", "status"} <= set(header),
              f"sweep.csv: one row per combination ({header})", f)
        ok = True
        for row in body:
            rec = dict(zip(header, row))
            summ = json.load(open(os.path.join(sw, rec["run"], "summary.json")))
            st = json.load(open(os.path.join(sw, rec["run"], "final", "trainer_state.json")))["options"]
            ok = ok and abs(float(rec["val_loss"]) - summ["val_loss"]) < 1e-4 and st["lora_rank"] == int(rec["lora_rank"]) \
                and abs(st["lr"] - float(rec["lr"])) < 1e-6 * float(rec["lr"]) and rec["status"] == "done"
        check(ok, "each row holds its run's flags and results", f)
        check(os.path.exists(os.path.join(sw, "sweep.png")) and "| lora_rank |" in open(os.path.join(sw, "sweep.md")).read(),
              "sweep.md and sweep.png written", f)
        os.remove(os.path.join(sw, body[1][0], "summary.json"))  # as if interrupted after its checkpoints
        r = run(sweep, timeout=300)
        check(r.returncode == 0 and r.stdout.count("finished earlier; skipped") == 3 and
              os.path.exists(os.path.join(sw, body[1][0], "summary.json")),
              "a second sweep skips finished runs and completes the rest", f)
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
