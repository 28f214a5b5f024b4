#!/usr/bin/env python3
"""anvil and the Hugging Face ecosystem, both ways, where transformers and peft are importable (the GPU
machine has them; elsewhere this test skips with a notice, exit 77):

  1. an anvil GPT-2 checkpoint loads with transformers.GPT2LMHeadModel.from_pretrained, logits within 1e-4;
  2. a checkpoint transformers saved (random init) trains in anvil, and its logits match before training;
  3. an anvil LoRA adapter loads with peft.PeftModel.from_pretrained, logits within 1e-4;
  4. an adapter PEFT saved (non-zero A and B) loads in anvil (anvil_logits_dump --adapter), logits within 1e-4;
  5. an anvil Llama checkpoint (grouped-query attention, Llama 3.1 rope scaling, written as shards) loads with
     transformers.LlamaForCausalLM.from_pretrained, logits within 1e-4; its bf16 copy (lora merge --dtype bf16)
     loads too;
  6. a LlamaForCausalLM checkpoint transformers saved (random init) gives anvil the same logits and trains;
  7. an anvil LoRA adapter on that Llama loads with peft, logits within 1e-4;
  8. the relatives: an anvil Qwen2 (--arch qwen2) loads with AutoModelForCausalLM (Qwen2ForCausalLM), and
     Qwen2 and Mistral (sliding_window shorter than max_position_embeddings) checkpoints transformers saved,
     biases made non-zero, give anvil the same logits.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    import peft
except ImportError as e:
    print(f"SKIPPED: the Hugging Face interop test needs torch, transformers and peft ({e}); "
          "they are on the GPU machine, not in Debian")
    sys.exit(77)

ANVIL = os.environ["ANVIL_BIN"]
LOGITS = os.environ["ANVIL_LOGITS_DUMP"]
TOL = 1e-4
IDS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67]


def anvil_logits(model_dir, adapter="-"):
    r = subprocess.run([LOGITS, model_dir, adapter, ",".join(map(str, IDS))], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: anvil_logits_dump {model_dir} {adapter}: {r.stderr}")
    return torch.tensor(json.loads(r.stdout))


def hf_logits(model):
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float()


def compare(a, b, what, failures):
    err = float((a - b).abs().max() / b.abs().max())
    print(f"{what}: max |difference| / max |logit| = {err:.2e}")
    if not err <= TOL:
        failures.append(f"{what}: {err:.2e}")


def llama(tmp, data, failures):
    common = ["--data", data, "--device", "cpu", "--threads", "2", "--vocab", "257", "--seq", "64"]
    run = os.path.join(tmp, "llama")
    subprocess.run([ANVIL, "train", *common, "--arch", "llama", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                    "--dim", "64", "--steps", "20", "--max-shard-size", "100K", "--out", run], check=True,
                   capture_output=True)
    base = os.path.join(run, "final")
    cfg = json.load(open(os.path.join(base, "config.json")))
    # 5. anvil -> transformers, with Llama 3.1 rope scaling written into the config (anvil reads it back too)
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16}
    cfg["rope_theta"] = 500000.0
    json.dump(cfg, open(os.path.join(base, "config.json"), "w"), indent=2)
    hf = transformers.LlamaForCausalLM.from_pretrained(base).float().eval()
    compare(anvil_logits(base), hf_logits(hf), "anvil Llama checkpoint (GQA, llama3 rope, sharded) in transformers",
            failures)
    merged = os.path.join(tmp, "llama_bf16")
    lora_run = os.path.join(tmp, "llama_lora")
    subprocess.run([ANVIL, "train", *common, "--init", base, "--lora-rank", "4", "--lora-targets",
                    "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--lr", "1e-2", "--out", lora_run,
                    "--steps", "20"], check=True, capture_output=True)
    adapter = os.path.join(lora_run, "final")
    # 7. anvil LoRA on Llama -> peft
    pm = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(base).float(),
                                        adapter).eval()
    compare(anvil_logits(base, adapter), hf_logits(pm), "anvil Llama adapter in peft", failures)
    subprocess.run([ANVIL, "lora", "merge", "--model", base, "--adapter", adapter, "--dtype", "bf16", "--out",
                    merged], check=True, capture_output=True)
    hb = transformers.LlamaForCausalLM.from_pretrained(merged).float().eval()
    compare(anvil_logits(merged), hf_logits(hb), "anvil bf16 merged Llama in transformers", failures)
    # 6. transformers -> anvil
    lc = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=1, max_position_embeddings=64, vocab_size=257,
                                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    fresh = transformers.LlamaForCausalLM(lc).eval()
    hf_dir = os.path.join(tmp, "hf_llama")
    fresh.save_pretrained(hf_dir)  # safetensors (transformers 5 has no safe_serialization)
    compare(anvil_logits(hf_dir), hf_logits(fresh), "transformers Llama checkpoint in anvil", failures)
    r = subprocess.run([ANVIL, "train", *common, "--init", hf_dir, "--tokenizer", "byte", "--out",
                        os.path.join(tmp, "from_hf_llama"), "--steps", "5"], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"anvil could not train from the transformers Llama checkpoint: {r.stderr[-300:]}")


def relatives(tmp, data, failures):
    common = ["--data", data, "--device", "cpu", "--threads", "2", "--vocab", "257", "--seq", "64"]
    run = os.path.join(tmp, "qwen2")
    subprocess.run([ANVIL, "train", *common, "--arch", "qwen2", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                    "--dim", "64", "--out", run, "--steps", "10"], check=True, capture_output=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(run, "final")).float().eval()
    if type(hf).__name__ != "Qwen2ForCausalLM":
        failures.append(f"anvil's qwen2 config.json loads as {type(hf).__name__}, not Qwen2ForCausalLM")
    compare(anvil_logits(os.path.join(run, "final")), hf_logits(hf), "anvil Qwen2 checkpoint in transformers",
            failures)
    configs = {
        "qwen2": transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          vocab_size=257, tie_word_embeddings=True, use_sliding_window=False),
        "mistral": transformers.MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=64, sliding_window=32, vocab_size=257),
    }
    for name, cfg in configs.items():
        fresh = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():  # transformers starts biases at zero: give them values to carry
            for n, t in fresh.named_parameters():
                if n.endswith(".bias"):
                    t.copy_(0.1 * torch.randn_like(t))
        d = os.path.join(tmp, "hf_" + name)
        fresh.save_pretrained(d)  # safetensors (transformers 5 has no safe_serialization)
        compare(anvil_logits(d), hf_logits(fresh), f"transformers {type(fresh).__name__} checkpoint in anvil",
                failures)


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        open(data, "w").write(" ".join(["alpha beta gamma delta", "GPU tensor 42"] * 3000))
        run = os.path.join(tmp, "run")
        # the checks are of the formats: train on the CPU (the GPU tests cover the CUDA backend)
        common = ["--data", data, "--device", "cpu", "--threads", "2", "--vocab", "257"]
        subprocess.run([ANVIL, "train", *common, "--out", run, "--steps", "20", "--layers", "2", "--heads", "2",
                        "--dim", "64", "--seq", "64"], check=True, capture_output=True)
        base = os.path.join(run, "final")
        # 1. anvil -> transformers
        hf = transformers.GPT2LMHeadModel.from_pretrained(base).eval()
        compare(anvil_logits(base), hf_logits(hf), "anvil checkpoint in transformers", failures)
        # 2. transformers -> anvil
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=257)
        fresh = transformers.GPT2LMHeadModel(cfg).eval()
        hf_dir = os.path.join(tmp, "hf")
        fresh.save_pretrained(hf_dir)  # safetensors (transformers 5 has no safe_serialization)
        compare(anvil_logits(hf_dir), hf_logits(fresh), "transformers checkpoint in anvil", failures)
        r = subprocess.run([ANVIL, "train", *common, "--init", hf_dir, "--tokenizer", "byte", "--out",
                            os.path.join(tmp, "from_hf"), "--steps", "5", "--seq", "64"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"anvil could not train from the transformers checkpoint: {r.stderr[-300:]}")
        # 3. anvil LoRA -> peft
        lora_run = os.path.join(tmp, "lora")
        subprocess.run([ANVIL, "train", *common, "--init", base, "--lora-rank", "4", "--lora-targets", "c_attn,c_fc",
                        "--lr", "1e-2", "--out", lora_run, "--steps", "20", "--seq", "64"], check=True,
                       capture_output=True)
        adapter = os.path.join(lora_run, "final")
        pm = peft.PeftModel.from_pretrained(transformers.GPT2LMHeadModel.from_pretrained(base), adapter).eval()
        compare(anvil_logits(base, adapter), hf_logits(pm), "anvil adapter in peft", failures)
        # 4. peft -> anvil: an adapter PEFT saved, non-zero A and B
        lc = peft.LoraConfig(r=2, lora_alpha=5, target_modules=["c_proj"], fan_in_fan_out=True, task_type="CAUSAL_LM")
        pm2 = peft.get_peft_model(transformers.GPT2LMHeadModel.from_pretrained(base), lc)
        with torch.no_grad():
            for n, t in pm2.named_parameters():
                if "lora_" in n:
                    t.copy_(0.1 * torch.randn_like(t))
        peft_dir = os.path.join(tmp, "peft_adapter")
        pm2.save_pretrained(peft_dir)
        compare(anvil_logits(base, peft_dir), hf_logits(pm2.eval()), "peft adapter in anvil", failures)
        llama(tmp, data, failures)
        relatives(tmp, data, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: checkpoints and adapters move between anvil and Hugging Face both ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
