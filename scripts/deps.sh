#!/usr/bin/env bash
# Installs the system packages anvil needs, skipping those already present. Debian/Ubuntu: apt-get (as root
# or through sudo). Elsewhere: prints what to install and continues (CMake then says what it cannot find).
#   scripts/deps.sh            build + test dependencies
#   scripts/deps.sh --build    only what the build needs
set -euo pipefail

build_pkgs=(cmake g++ make pkg-config libopenblas-openmp-dev libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev libcli11-dev libfmt-dev libicu-dev libpcre2-dev libcsv-dev libopenmpi-dev libcpp-httplib-dev
            libgtest-dev libbenchmark-dev clang libprotobuf-dev protobuf-compiler libboost-dev gnuplot-nox)
test_pkgs=(python3 python3-numpy python3-torch python3-regex python3-protobuf openmpi-bin)
# node and npm (for the GPT-2 tokenizer cross-check) may come from NodeSource, whose nodejs bundles npm and
# conflicts with Debian's npm package: look for the commands, install Debian's only when both are missing.

pkgs=("${build_pkgs[@]}")
if [[ "${1:-}" != "--build" ]]; then
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
