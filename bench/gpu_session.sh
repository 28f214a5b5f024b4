#!/usr/bin/env bash
# On the lent GPU machine, from the bundle scripts/gpu_bundle.sh made here (carry .gpu-run):
#   bash bench/gpu_session.sh tests   GPU tests, then the transformers/peft interop test
#   bash bench/gpu_session.sh sanitize  compute-sanitizer memcheck, racecheck, synccheck and initcheck on the op
#                                     tests, each at most $SAN_TIMEOUT seconds (default 135: the four fit one
#                                     10-minute device call)
#   bash bench/gpu_session.sh bench   every op at GPT-2 124M's sizes in bf16 (anvil_op_bench), then the GPT-2
#                                     124M training benchmark (bench/gpu_train_bench.py), then the multi-GPU
#                                     step-time model from its rate (bench/step_time_model.py)
#   bash bench/gpu_session.sh fp8     --precision fp8 against bf16 at GPT-2 124M and 24 layers x 1024
#                                     (bench/gpu_fp8_bench.py)
#   bash bench/gpu_session.sh train   GPT-2 124M on real text (the bundle's corpus) for 500 steps from one init:
#                                     anvil bf16 against the PyTorch reference step by step, and anvil fp8
#                                     against anvil bf16 (bench/loss_match.py)
# Writes few files under $OUT (the device tool returns at most 8).
set -uo pipefail
what=${1:-tests}
out=${OUT:-/tmp/anvil-out}
mkdir -p "$out"
root=/tmp/anvil-gpu
if [ ! -x "$root/bin/anvil" ]; then
  mkdir -p "$root" && tar -xJf .gpu-run/bundle.tar.xz -C "$root" || exit 1
fi
export LD_LIBRARY_PATH="$root/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
{
  echo "bundle commit $(cat "$root/commit"), tree commit $(git rev-parse HEAD 2> /dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$root/bin/anvil" doctor
} > "$out/device.txt" 2>&1
cat "$out/device.txt"
case "$what" in
  tests)
    "$root/bin/anvil_gpu_tests" --gtest_output="json:$out/gpu_tests.json" 2>&1 | tee "$out/gpu_tests.log"
    # transformers and peft are on this machine: checkpoints and adapters both ways
    ANVIL_BIN="$root/bin/anvil" ANVIL_LOGITS_DUMP="$root/bin/anvil_logits_dump" python3 tests/oracle/test_hf_interop.py \
      2>&1 | tee "$out/hf_interop.log"
    ;;
  sanitize)
    for tool in memcheck racecheck synccheck initcheck; do
      echo "== compute-sanitizer --tool $tool"
      timeout "${SAN_TIMEOUT:-135}" compute-sanitizer --tool "$tool" --error-exitcode 1 "$root/bin/anvil_gpu_tests" \
        --gtest_filter='CudaOps*:CudaOptimizer*:CudaBackend*' 2>&1 | tail -n 40
      echo "exit status ${PIPESTATUS[0]} (124: stopped at the time limit)"
    done 2>&1 | tee "$out/sanitizers.log"
    ;;
  bench)
    "$root/bin/anvil_op_bench" --device cuda --dtype bf16 --sizes gpt2 2>&1 | tee "$out/op_bench.txt"
    python3 bench/gpu_train_bench.py --anvil "$root/bin/anvil" --gpt2-vocab "$root/gpt2" \
      --shared-bench "$root/torch_gpt2_bench.py" --out "$out" "${@:2}"
    # docs/distributed.md's step time on 8 to 128 H100s, from the rate just measured
    [ -f "$out/gpu_train_bench.json" ] && python3 bench/step_time_model.py --compute-json "$out/gpu_train_bench.json" \
      --json "$out/step_time_model.json" 2>&1 | tee "$out/step_time_model.txt"
    ;;
  fp8)
    python3 bench/gpu_fp8_bench.py --anvil "$root/bin/anvil" --gpt2-vocab "$root/gpt2" --out "$out" "${@:2}" \
      2>&1 | tee "$out/fp8_bench.log"
    ;;
  train)
    data=(); [ -d "$root/corpus" ] && data=(--data "$root/corpus")  # else give --text FILES
    # eight files back at most: device.txt, logs.txt, loss_match.json, summary.txt, three metrics.jsonl, a plot
    python3 bench/loss_match.py --anvil "$root/bin/anvil" "${data[@]}" --fp8 --out "$out" "${@:2}" 2>&1
    ;;
  *) echo "usage: gpu_session.sh tests|sanitize|bench|fp8|train [benchmark flags]"; exit 2 ;;
esac
