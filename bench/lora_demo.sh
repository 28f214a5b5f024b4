#!/usr/bin/env bash
# Pretrained, then adapted: the README's LoRA demo, end to end on the CPU.
#   1. pretrain a small GPT-2 (6 layers, width 256) on English text (the licence texts every Debian has),
#   2. fine-tune it on the seed-format instruction data (the embedded default's reversing, sorting and
#      uppercasing) twice: with LoRA (rank 16 on every linear layer, the base frozen) and every weight,
#   3. report exact match before and after, the wall time, the peak memory, and what each writes to disk.
#   bench/lora_demo.sh [ANVIL] [WORKDIR]
set -euo pipefail
anvil=$(realpath "${1:-build/anvil}")
work=${2:-$(mktemp -d)}
mkdir -p "$work" && cd "$work"
cat /usr/share/common-licenses/* /usr/share/doc/*/copyright 2> /dev/null | head -c 4000000 > text.txt || true
common=(--threads 0 --tensorboard off --log-every 100)

echo "== 1. pretrain on $(wc -c < text.txt) bytes of English text"
"$anvil" train --data text.txt --layers 6 --heads 8 --dim 256 --seq 128 --batch 16 --steps 1500 --lr 1e-3 \
  --warmup 100 --out pretrain "${common[@]}" > pretrain.log 2>&1
tail -n 3 pretrain.log

echo "== the instruction data (anvil train's embedded default writes it)"
"$anvil" train --steps 1 --out datarun "${common[@]}" > /dev/null 2>&1
data=datarun/data.jsonl
echo "$(wc -l < $data) records, e.g. $(head -n 1 $data)"
tail -n 1000 "$data" > heldout.jsonl  # the validation split training holds out (--val-fraction 0.05, from the end)

echo "== 2. the pretrained model on the held-out examples, before any fine-tuning"
"$anvil" eval --model pretrain --data heldout.jsonl --template compact --max-examples 300

ft=(--init pretrain/final --data "$data" --template compact --seq 64 --batch 32 --steps 1500 --warmup 50
    --val-fraction 0.05 --eval-examples 300 "${common[@]}")
echo "== 3a. LoRA: rank 16 on c_attn, c_proj, c_fc; the base frozen"
/usr/bin/time -f "%e s wall, %M KB peak RSS" "$anvil" train "${ft[@]}" --lora-rank 16 --lora-alpha 32 \
  --lora-targets c_attn,c_proj,c_fc --lr 3e-3 --out lora > lora.log 2>&1 || { tail lora.log; exit 1; }
grep -E "exact match|validation" lora.log; tail -n 1 lora.log
"$anvil" eval --model pretrain --adapter lora/final --data heldout.jsonl --template compact --max-examples 300
echo "== 3b. full fine-tuning"
/usr/bin/time -f "%e s wall, %M KB peak RSS" "$anvil" train "${ft[@]}" --lr 1e-3 --out full > full.log 2>&1 \
  || { tail full.log; exit 1; }
grep -E "exact match|validation" full.log; tail -n 1 full.log
echo "== on disk"
du -sh pretrain/final lora/final full/final
ls -la lora/final/adapter_model.safetensors full/final/model.safetensors full/final/optimizer.safetensors
