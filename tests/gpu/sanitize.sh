#!/usr/bin/env bash
# compute-sanitizer over the GPU tests: sanitize.sh TOOL TEST_BINARY [gtest filter]. TOOL is memcheck,
# racecheck, initcheck or synccheck. Exits 77 (a ctest skip) where there is no GPU or no compute-sanitizer.
set -uo pipefail
tool=$1 bin=$2 filter=${3:-*}
"$bin" --gtest_filter=-* > /dev/null
if [ $? -eq 77 ]; then echo "SKIPPED: no usable CUDA device; compute-sanitizer needs one"; exit 77; fi
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
if [ -z "$sanitizer" ]; then echo "SKIPPED: compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 77; fi
exec "$sanitizer" --tool "$tool" --error-exitcode 1 "$bin" --gtest_filter="$filter"
