#!/usr/bin/env bash
# On the lent GPU machine, from the bundle scripts/gpu_bundle.sh made here (carry .gpu-run):
#   bash bench/gpu_session.sh contact the first call of a session (a session has 15 minutes of device time:
#                                     a call of up to 10 minutes, and a second if the first left 5). Within
#                                     $CONTACT_BUDGET seconds (default 540), most important first, each step
#                                     capped so the later ones still run: the libraries the binaries find, a
#                                     smoke run of `anvil train --device cuda` (fp32, bf16), the GPU tests
#                                     one crash or sticky CUDA error at a time (tests/gpu/run_isolated.py),
#                                     attention at 124M's sizes (B = 8 and 64) in each of anvil's
#                                     implementations, cuDNN's fused attention among them, beside PyTorch's
#                                     fused kernels, the GPT-2 124M benchmark (64 x 1024 x 8 a step; anvil
#                                     with --attention auto, cudnn, cudnn+tune, cudnn+tune+logits:0: see
#                                     gpu_train_bench.py --help; $BENCH_ATTENTION overrides) with
#                                     torch.profiler's kernel table of the reference, the step-time model,
#                                     the same benchmark at 16 x 1024 (bench16), GPT-2
#                                     124M for 500 steps on real text against PyTorch (loss_match.py, bf16),
#                                     fp8 against bf16, racecheck, synccheck, initcheck and memcheck on the op
#                                     tests, every other op's rate at 124M's sizes (anvil_op_bench), and the
#                                     transformers/peft interop test. A table of every step's outcome comes
#                                     last; at most 8 files under $OUT (the loss comparison's, fp8's and
#                                     ncu's in extra.tar.gz).
#                                     CONTACT_STEPS="gpu_tests bench ..." runs only the steps named, in this
#                                     order; fp8_diag (the FP8 tests with cuBLASLt's API log), ncu (Nsight
#                                     Compute's per-kernel time and DRAM bytes for one 124M step; ncu_fp8
#                                     the same in fp8 with delayed scaling), bench774
#                                     (GPT-2 774M), llama1b (a Llama 1B-class, against the reference's
#                                     --arch llama), fp8_xl (fp8 against bf16 at GPT-2 XL's shape) and
#                                     decode (batch-1 decode of both models against the bandwidth roofline
#                                     and anvil serve at 16 and 64 in flight, beside transformers: see
#                                     bench/gpu_decode_bench.py) run only when named. decode124 (GPT-2
#                                     124M's batch-1 decode with and without CUDA graphs and the direct
#                                     products, and in int8, in extra.tar.gz)
#                                     runs by default, after the training steps.
#   bash bench/gpu_session.sh tests   GPU tests, then the transformers/peft interop test
#   bash bench/gpu_session.sh sanitize  compute-sanitizer memcheck, racecheck, synccheck and initcheck on the op
#                                     tests, each at most $SAN_TIMEOUT seconds (default 135: the four fit one
#                                     10-minute device call)
#   bash bench/gpu_session.sh bench   every op at GPT-2 124M's sizes in bf16 (anvil_op_bench) and PyTorch's
#                                     attention at those sizes (bench/torch_attention_bench.py), then the GPT-2
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
# unpacked once per bundle (a warm machine keeps /tmp between calls)
sum=$(sha1sum .gpu-run/bundle.tar.xz | cut -d' ' -f1)
if [ ! -x "$root/bin/anvil" ] || [ "$(cat "$root/bundle.sha1" 2> /dev/null)" != "$sum" ]; then
  rm -rf "$root" && mkdir -p "$root" && tar -xJf .gpu-run/bundle.tar.xz -C "$root" || exit 1
  echo "$sum" > "$root/bundle.sha1"
fi
# the toolkit's libraries first, then those pip installed beside PyTorch (NCCL and cuDNN live only there)
pylibs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(d for p in nvidia.__path__
  for d in glob.glob(os.path.join(p, "*", "lib")))))' 2> /dev/null || true)
export LD_LIBRARY_PATH="$root/lib:/usr/local/cuda/lib64:${pylibs:+$pylibs:}${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
# a library the binaries still miss (a toolkit laid out otherwise): its folder, wherever it is, joins the path;
# cuBLASLt too, which anvil loads at run time (so ldd does not list it) unless the path already has it
have_lt=$(for d in $(tr : ' ' <<< "$LD_LIBRARY_PATH"); do ls "$d"/libcublasLt.so.13 > /dev/null 2>&1 && echo yes &&
  break; done)
for lib in $(ldd "$root"/bin/* 2> /dev/null | awk '/not found/{print $1}' | sort -u) \
  $( [ -z "$have_lt" ] && ! ldconfig -p 2> /dev/null | grep -q 'libcublasLt\.so\.13 ' && echo libcublasLt.so.13); do
  found=$(find /usr /opt /lib* -name "$lib" -print -quit 2> /dev/null)
  [ -n "$found" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
done
{
  echo "bundle commit $(cat "$root/commit"), tree commit $(git rev-parse HEAD 2> /dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  missing=$(ldd "$root"/bin/* 2> /dev/null | grep 'not found' | sort -u)
  echo "libraries not found: ${missing:-none}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  "$root/bin/anvil" doctor
} > "$out/device.txt" 2>&1
cat "$out/device.txt"
case "$what" in
  contact)
    budget=${CONTACT_BUDGET:-540} t0=$SECONDS log=$out/contact.log work=$(mktemp -d)
    steps=()
    # step NAME CAP COMMAND...: runs it for at most CAP seconds (less if the budget is nearly spent)
    step() {
      local name=$1 cap=$2 left=$((budget - (SECONDS - t0))) rc s0=$SECONDS from
      shift 2
      [ "$cap" -gt "$left" ] && cap=$left
      if [ "$cap" -lt 10 ]; then steps+=("$(printf '%-12s not run (budget spent)' "$name")"); return; fi
      echo "== $name (at most ${cap}s): $*" >> "$log"
      from=$(($(wc -l < "$log") + 1))
      timeout -k 5 "$cap" "$@" >> "$log" 2>&1
      rc=$?
      steps+=("$(printf '%-12s exit %-4s %4ss%s' "$name" "$rc" "$((SECONDS - s0))" \
        "$([ "$rc" = 124 ] && echo ' (stopped at its cap)')")")
      echo "== $name (at most ${cap}s): exit $rc after $((SECONDS - s0))s"
      tail -n "+$from" "$log" | tail -n 25
    }
    # want NAME: the step is in $CONTACT_STEPS (a space-separated list; unset: every step but the opt-in ones)
    want() { if [ -n "${CONTACT_STEPS:-}" ]; then [[ " $CONTACT_STEPS " == *" $1 "* ]]; else [ "${2:-}" != opt-in ]; fi; }
    # anvil train on the card, the embedded default: fp32, then bf16
    smoke='for p in fp32 bf16; do "$0" train --device cuda --precision $p --steps 60 --log-every 20 \
      --eval-examples 50 --tensorboard off --out "$1/smoke-$p" || exit; done'
    want smoke && step smoke 90 bash -c "$smoke" "$root/bin/anvil" "$work"
    # (the full test log stays on the machine: at most 8 files come back, and its failures are in contact.log)
    want gpu_tests && step gpu_tests 200 python3 tests/gpu/run_isolated.py "$root/bin/anvil_gpu_tests" --budget 190 \
      --test-timeout 90 --json "$out/gpu_tests.json" --log "$work/gpu_tests.log"
    # issue 48: the Python layer on the card (a short anvil.train on CUDA, forward's logits through
    # torch.from_dlpack on the device without a copy); the bundle's module is built for this machine's python3
    want python && [ -d "$root/python/anvil" ] && step python 60 env PYTHONPATH="$root/python" \
      python3 bench/gpu_python_check.py
    # opt-in: the FP8 probe table (CudaFp8Lt) and one FP8 op case with cuBLASLt's API log, under the toolkit's
    # cuBLASLt (what anvil finds first) and then under PyTorch's own (pip's nvidia-cublas), and the same products
    # through torch._scaled_mm; the full API logs go to extra.tar.gz, the tables to contact.log
    fp8_diag='mkdir -p "$1/fp8_diag"; rc=0; filter="CudaFp8Lt.*:*matmul_fp8_32x32_48*BF16"
      CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE="$1/fp8_diag/anvil-toolkit.log" "$0" --gtest_filter="$filter" || rc=1
      if [ -n "$2" ]; then echo "== the same under PyTorch cuBLASLt ($2)"
        LD_LIBRARY_PATH="$2:$LD_LIBRARY_PATH" CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE="$1/fp8_diag/anvil-pip.log" \
          "$0" --gtest_filter="$filter" || rc=1; fi
      CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE="$1/fp8_diag/torch.log" python3 bench/torch_fp8_probe.py || rc=1
      exit $rc'
    pip_lt=$(for d in $(tr : ' ' <<< "$pylibs"); do ls "$d"/libcublasLt.so* > /dev/null 2>&1 && echo "$d" && break; done)
    want fp8_diag opt-in && step fp8_diag 45 bash -c "$fp8_diag" "$root/bin/anvil_gpu_tests" "$work" "$pip_lt"
    # attention at GPT-2 124M's sizes (B = 8 and llm.c's micro-batch, 64): anvil's implementations (cuDNN's
    # fused attention among them), then PyTorch's kernels, same columns
    want attn && step attn 90 bash -c '"$0" --device cuda --dtype bf16 --sizes gpt2 --only "attention B=" &&
      python3 bench/torch_attention_bench.py --batch 8,64' "$root/bin/anvil_op_bench"
    # issue 9's configuration: micro-batches of 64 x 1024 accumulated 8 times (524,288 tokens a step, as llm.c
    # trains 124M); --attention auto (flash on the tensor cores in bf16), cuDNN's fused attention, the same with
    # cuBLASLt's algorithms timed per shape (--gemm-tune on), and that with a micro-batch's logits at once
    # (BENCH_ATTENTION overrides the variants; the reference runs two more steps under torch.profiler)
    want bench && step bench 300 python3 bench/gpu_train_bench.py --anvil "$root/bin/anvil" \
      --gpt2-vocab "$root/gpt2" --shared-bench "$root/torch_gpt2_bench.py" --out "$out/bench" --batch 64 \
      --grad-accum 8 --steps 6 --warmup 2 --profile-steps 3 --torch-profile-steps 2 \
      --attention "${BENCH_ATTENTION:-auto,cudnn,cudnn+tune,cudnn+tune+logits:0}" "${@:2}"
    want bench && [ -f "$out/bench/gpu_train_bench.json" ] && step step_model 20 python3 bench/step_time_model.py \
      --compute-json "$out/bench/gpu_train_bench.json" --json "$work/step_time_model.json"
    # the first card run's configuration, 16 x 1024 a step, against both baselines (its JSON comes back; its
    # table is in contact.log); auto+kgelu: the MLP's GELU as a kernel, not in cuBLASLt's epilogue (the lever's
    # before and after in one call)
    want bench16 && step bench16 200 python3 bench/gpu_train_bench.py --anvil "$root/bin/anvil" \
      --gpt2-vocab "$root/gpt2" --shared-bench "$root/torch_gpt2_bench.py" --out "$work/bench16" --batch 16 \
      --steps 10 --warmup 3 --profile-steps 0 --attention "${BENCH16_ATTENTION:-auto,cudnn,auto+kgelu}"
    [ -f "$work/bench16/gpu_train_bench.json" ] && mkdir -p "$out/bench16" &&
      cp "$work/bench16/gpu_train_bench.json" "$out/bench16/"
    # GPT-2 124M on the bundle's real text for 500 steps from one init, anvil bf16 against PyTorch step by step
    # (bench/loss_match.py; fp8 is the next step's business, so a failing fp8 cannot cost this comparison);
    # its files come back as one archive
    data=(); [ -d "$root/corpus" ] && data=(--data "$root/corpus")
    want train && step train 240 python3 bench/loss_match.py --anvil "$root/bin/anvil" "${data[@]}" \
      --out "$work/train"
    # fp8 against bf16 at GPT-2 124M and 24 layers x 1024, and each linear layer's product in both from the runs'
    # --profile (3 steps each: about 10 s a run more; the four runs took 165 s without them on the H200)
    want fp8 && step fp8 240 python3 bench/gpu_fp8_bench.py --anvil "$root/bin/anvil" --gpt2-vocab "$root/gpt2" \
      --steps 8 --warmup 2 --profile-steps 3 --out "$work/fp8"
    [ -f "$work/fp8/fp8_bench.json" ] && cp "$work/fp8/fp8_bench.json" "$out/"
    # opt-in: the same at GPT-2 XL's shape (48 layers x 1600, batch 4 x 1024), issue 44's FP8 goal (>= 1.25x bf16)
    want fp8_xl opt-in && step fp8_xl 240 python3 bench/gpu_fp8_bench.py --anvil "$root/bin/anvil" \
      --gpt2-vocab "$root/gpt2" --configs gpt2-1.5B --steps 6 --warmup 2 --profile-steps 2 --out "$work/fp8_xl"
    [ -f "$work/fp8_xl/fp8_bench.json" ] && mkdir -p "$out/fp8_xl" && cp "$work/fp8_xl/fp8_bench.json" "$out/fp8_xl/"
    # opt-in (a second call's, CONTACT_STEPS="bench774 llama1b"): issue 44's larger goals against the reference,
    # GPT-2 774M (36 layers x 1280, 20 heads) and a Llama of Llama 3.2 1B's shape (16 layers x 2048, 32 query and
    # 8 key/value heads, MLP 8192; GPT-2's vocabulary padded to 50304), each JSON back, its table in contact.log
    for big in "bench774 --layers 36 --dim 1280 --heads 20 --batch 16" \
      "llama1b --arch llama --layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn-dim 8192 --batch 8"; do
      read -r name flags <<< "$big"
      # shellcheck disable=SC2086
      want "$name" opt-in && step "$name" 240 python3 bench/gpu_train_bench.py --anvil "$root/bin/anvil" \
        --gpt2-vocab "$root/gpt2" --shared-bench "$root/torch_gpt2_bench.py" --out "$work/$name" $flags \
        --steps 6 --warmup 2 --profile-steps 0 \
        --attention "${BENCH16_ATTENTION:-$([ "$name" = llama1b ] && echo auto,cudnn,auto+apart || echo auto,cudnn)}"
      [ -f "$work/$name/gpu_train_bench.json" ] && mkdir -p "$out/$name" &&
        cp "$work/$name/gpu_train_bench.json" "$out/$name/"
    done
    # batch-1 decode of GPT-2 124M, each step replayed as a CUDA graph, then launched kernel by kernel
    # (ANVIL_CUDA_GRAPHS=0), then with the direct products (ANVIL_DIRECT_PRODUCTS=1), then on an int8 copy,
    # against the bandwidth roofline: the decode levers' first figures, in about a minute
    want decode124 && step decode124 90 python3 bench/gpu_decode_bench.py --anvil "$root/bin/anvil" \
      --gpt2-vocab "$root/gpt2" --skip-llama --skip-hf --levels '' --rounds 2 --new-tokens 128 --out "$work/decode124"
    # opt-in: inference (bench/gpu_decode_bench.py): batch-1 decode of GPT-2 124M and the Llama 1B-class against
    # the bandwidth roofline, and anvil serve at 16 and 64 in flight, each beside transformers' generate
    want decode opt-in && step decode 240 python3 bench/gpu_decode_bench.py --anvil "$root/bin/anvil" \
      --gpt2-vocab "$root/gpt2" --out "$work/decode"
    [ -f "$work/decode/gpu_decode_bench.json" ] && cp "$work/decode/gpu_decode_bench.json" "$out/"
    # compute-sanitizer on the op tests (memcheck took 9 s on the H100; synccheck and initcheck 5 s each on the
    # H200, where racecheck got through 174 of the 227 tests in a minute), then the op rates
    for tool in racecheck synccheck initcheck memcheck; do
      cap=60; [ "$tool" = racecheck ] && cap=150
      want "$tool" && step "$tool" "$cap" compute-sanitizer --tool "$tool" --error-exitcode 1 \
        "$root/bin/anvil_gpu_tests" --gtest_filter='*CudaOps*:*CudaOptimizer*:*CudaFp8Scale*:CudaBackend*'
    done
    want op_bench && step op_bench 90 "$root/bin/anvil_op_bench" --device cuda --dtype bf16 --sizes gpt2
    want hf_interop && step hf_interop 100 env ANVIL_BIN="$root/bin/anvil" \
      ANVIL_LOGITS_DUMP="$root/bin/anvil_logits_dump" python3 tests/oracle/test_hf_interop.py
    # opt-in: Nsight Compute's time and DRAM bytes of every kernel of GPT-2 124M's second step (bf16, batch 16),
    # the per-kernel split --profile's per-op table cannot give
    want ncu opt-in && step ncu 150 bash -c 'ncu --csv --page raw --log-file "$2/ncu.csv" --metrics \
      gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --launch-skip 1000 --launch-count 1000 \
      "$0" train --device cuda --data "$1" --layers 12 --heads 12 --dim 768 --vocab 50304 --seq 1024 --batch 16 \
      --steps 3 --eval-every 0 --tensorboard off --out "$2/ncu-run"' "$root/bin/anvil" \
      "$root/corpus" "$work"
    # opt-in: the same for --precision fp8 at that size, delayed scaling (ncu_fp8): the FP8 rounding kernels' time
    # and DRAM bytes, which say whether they now run at the copy rate (db1c307: the hardware's conversion)
    want ncu_fp8 opt-in && step ncu_fp8 150 bash -c 'ncu --csv --page raw --log-file "$2/ncu-fp8.csv" --metrics \
      gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --launch-skip 2000 --launch-count 2000 \
      "$0" train --device cuda --data "$1" --layers 12 --heads 12 --dim 768 --vocab 50304 --seq 1024 --batch 16 \
      --precision fp8 --fp8-scaling delayed --steps 3 --eval-every 0 --tensorboard off --out "$2/ncu-fp8-run"' \
      "$root/bin/anvil" "$root/corpus" "$work"
    # the loss comparison's files, fp8's runs and the kernel tables: one archive (at most 8 files come back)
    extra=(); for f in train fp8 fp8_xl ncu.csv ncu-fp8.csv fp8_diag decode124; do [ -e "$work/$f" ] && extra+=("$f"); done
    [ ${#extra[@]} -gt 0 ] && tar -czf "$out/extra.tar.gz" -C "$work" "${extra[@]}"
    { echo; echo "== contact: $((SECONDS - t0))s of ${budget}s"; printf '%s\n' "${steps[@]}"
      [ -f "$out/bench/summary.txt" ] && cat "$out/bench/summary.txt"
      for d in bench16 bench774 llama1b decode124 decode; do [ -f "$work/$d/summary.txt" ] && { echo; cat "$work/$d/summary.txt"; }
      done
      [ -f "$work/train/summary.txt" ] && cat "$work/train/summary.txt"
      [ -f "$work/fp8/fp8_summary.txt" ] && cat "$work/fp8/fp8_summary.txt"
      # attention at GPT-2 124M's sizes, anvil's implementations and PyTorch's kernels side by side
      grep -E '^attention B=8 T=1024 ' "$log" | sort -u; } |
      tee -a "$log"
    rm -rf "$work"
    # the GPU tests' table of what did not pass, last, where the reply shows it
    awk '/^== [0-9]+ tests in/{keep=1; n=0} keep && /^== [a-z]/{keep=0} keep && n++ < 60' "$log"
    ;;
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
        --gtest_filter='*CudaOps*:*CudaOptimizer*:*CudaFp8Scale*:CudaBackend*' 2>&1 | tail -n 40
      echo "exit status ${PIPESTATUS[0]} (124: stopped at the time limit)"
    done 2>&1 | tee "$out/sanitizers.log"
    ;;
  bench)
    "$root/bin/anvil_op_bench" --device cuda --dtype bf16 --sizes gpt2 2>&1 | tee "$out/op_bench.txt"
    # PyTorch's fused attention kernels at the same sizes, in the same columns
    python3 bench/torch_attention_bench.py 2>&1 | tee -a "$out/op_bench.txt"
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
  *) echo "usage: gpu_session.sh contact|tests|sanitize|bench|fp8|train [benchmark flags]"; exit 2 ;;
esac
