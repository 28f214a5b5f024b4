#!/usr/bin/env bash
# Builds the fuzz targets with clang and runs each for SECONDS (default 30) from its seed corpus.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
# Exit 77 (ctest: skipped, with a notice) when clang or libFuzzer is missing; non-zero on any finding.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?build dir}
secs=${2:-30}
if ! command -v clang++ >/dev/null 2>&1; then
    echo "SKIPPED: fuzzing needs clang++ with libFuzzer (apt-get install clang)"
    exit 77
fi
if ! cmake -S "$here" -B "$out" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug >"$out.log" 2>&1 ||
   ! cmake --build "$out" -j "$(nproc)" >>"$out.log" 2>&1; then
    cat "$out.log"
    echo "FAILED: building the fuzz targets"
    exit 1
fi
status=0
for t in jsonl tokenizer shard gguf; do
    work="$out/corpus_$t"
    mkdir -p "$work"
    cp -n "$here/corpus/$t/"* "$work/" 2>/dev/null || true
    echo "fuzz_$t: $secs s"
    if ! (cd "$out" && ASAN_OPTIONS=detect_leaks=1 "./fuzz_$t" -max_total_time="$secs" -max_len=4096 \
            -print_final_stats=1 "$work" >"$out/fuzz_$t.log" 2>&1); then
        tail -40 "$out/fuzz_$t.log"
        echo "FAILED: fuzz_$t found a crash (input saved in $out)"
        status=1
    else
        grep -E "stat::number_of_executed_units|cov:" "$out/fuzz_$t.log" | tail -2
    fi
done
exit $status
