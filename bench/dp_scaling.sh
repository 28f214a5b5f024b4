#!/usr/bin/env bash
# Data-parallel scaling on this machine: one process with T threads against `mpirun -np 2` with T/2 threads
# per rank, the same global batch, model and data, and the same two ranks with --zero 1 (ZeRO-1). Prints tokens/s
# of each, the scaling efficiency and the exposed communication per step (comm_ms: waiting for the gradient
# all-reduces, or ZeRO-1's reduces, after the backward).
# usage: bench/dp_scaling.sh [ANVIL] [WORKDIR] [THREADS]
set -euo pipefail
ANVIL=$(realpath "${1:-build/anvil}")
WORK=${2:-/tmp/anvil_dp_scaling}
THREADS=${3:-2}
mkdir -p "$WORK" && cd "$WORK"
rm -rf one two zero
python3 -c "
import random
r = random.Random(2)
words = 'the of and to in a is that for it as was with be by on not he this are or his from at which'.split()
open('corpus.txt', 'w').write(' '.join(r.choice(words) + r.choice(['', 's', 'ed', 'ing']) for _ in range(300000)))
"
M=(--data corpus.txt --layers 4 --heads 4 --dim 256 --seq 128 --steps 30 --log-every 1 --eval-examples 0
   --val-fraction 0.01 --tensorboard off)
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
"$ANVIL" train "${M[@]}" --batch 16 --threads "$THREADS" --out one > one.log 2>&1
mpirun -np 2 --oversubscribe "${ROOT[@]}" "$ANVIL" train "${M[@]}" --batch 8 --threads $((THREADS / 2)) --out two \
  > two.log 2>&1
mpirun -np 2 --oversubscribe "${ROOT[@]}" "$ANVIL" train "${M[@]}" --batch 8 --threads $((THREADS / 2)) --zero 1 \
  --out zero > zero.log 2>&1
python3 - "$THREADS" <<'PY'
import json, sys
def steps(d):  # the first step warms up
    return [json.loads(l) for l in open(d + "/metrics.jsonl")][1:]
one, two, zero = steps("one"), steps("two"), steps("zero")
mean = lambda xs: sum(xs) / len(xs)
t1 = mean([x["tokens_per_s"] for x in one]); t2 = mean([x["tokens_per_s"] for x in two])
step2 = mean([x["step_ms"] for x in two]); comm = mean([x["comm_ms"] for x in two])
res = {"threads": int(sys.argv[1]), "one_process_tokens_per_s": round(t1), "two_ranks_tokens_per_s": round(t2),
       "scaling_efficiency": round(t2 / t1, 3), "two_ranks_step_ms": round(step2, 1),
       "two_ranks_exposed_comm_ms": round(comm, 2), "exposed_comm_share": round(comm / step2, 3),
       "zero1_tokens_per_s": round(mean([x["tokens_per_s"] for x in zero])),
       "zero1_step_ms": round(mean([x["step_ms"] for x in zero]), 1),
       "zero1_exposed_comm_ms": round(mean([x["comm_ms"] for x in zero]), 2),
       "last_loss_one": one[-1]["loss"], "last_loss_two": two[-1]["loss"], "last_loss_zero1": zero[-1]["loss"]}
print(json.dumps(res, indent=1))
PY
