#!/usr/bin/env bash
# Installs the system packages anvil needs, skipping those already present. Debian/Ubuntu: apt-get (as root
# or through sudo). Elsewhere: prints what to install and continues (CMake then says what it cannot find).
#   scripts/deps.sh            build + test dependencies (make test)
#   scripts/deps.sh --build    what building everything needs (the test programs too)
#   scripts/deps.sh --run      what building and running the anvil binary needs (make run): a bare machine's
#                              first contact installs no test tool (PyTorch, node, GoogleTest, clang)
#   scripts/deps.sh --python   what building and importing the Python package needs (make python)
set -euo pipefail

# the anvil binary: compiler, CMake, BLAS and the libraries it links
run_pkgs=(cmake ninja-build g++ make pkg-config libopenblas-openmp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libicu-dev
          libpcre2-dev libcsv-dev libprotobuf-dev protobuf-compiler libboost-dev zlib1g-dev)
# everything else the build makes: oneDNN (bf16 on the CPU; its CMake config needs OpenCL's), the MPI plugin,
# the test programs (GoogleTest), the fuzzers (clang), `anvil plot` (gnuplot), the Python module (pybind11,
# DLPack's header, Debian's python3 headers)
build_pkgs=("${run_pkgs[@]}" libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev libgtest-dev libbenchmark-dev clang
            gnuplot-nox pybind11-dev python3-dev libdlpack-dev)
test_pkgs=(python3 python3-numpy python3-torch python3-regex python3-protobuf python3-pytest python3-pip python3-setuptools
           python3-wheel openmpi-bin ccache)
# node and npm (for the GPT-2 tokenizer cross-check) may come from NodeSource, whose nodejs bundles npm and
# conflicts with Debian's npm package: look for the commands, install Debian's only when both are missing.

case "${1:-}" in
    --run) pkgs=("${run_pkgs[@]}") ;;
    --python) pkgs=("${run_pkgs[@]}" pybind11-dev python3-dev libdlpack-dev python3-numpy) ;;
    *) pkgs=("${build_pkgs[@]}") ;;
esac
if [[ -z "${1:-}" ]]; then
    pkgs+=("${test_pkgs[@]}")
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: not a Debian/Ubuntu system; install the equivalents of: ${pkgs[*]}" >&2
    exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "deps: installing ${missing[*]}" >&2
if [[ $(id -u) -eq 0 ]]; then
    sudo_cmd=()
elif command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
else
    echo "deps: missing packages and no root or sudo; run: apt-get install ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
