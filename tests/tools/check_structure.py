#!/usr/bin/env python3
"""The architecture the build promises, checked in the sources:

1. Layers: every #include of an anvil header follows the arrows of src/CMakeLists.txt (core -> io -> backend ->
   monitor, data, model -> runtime -> train, serve -> cli, python; core -> dist -> runtime); only backend/factory.cpp knows
   the backends by name.
2. Files that fit in a head: no file under src/ over 800 lines.
3. Functions that fit on a screen: none over 80 lines anywhere in src/, but the kernels docs/architecture.md
   names (KERNEL_EXCEPTIONS).
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SRC = os.path.join(ROOT, "src")

# layer -> the layers its files may include (itself always)
ALLOWED = {
    "core": set(),
    "io": {"core"},
    "backend": {"core"},
    "backend/cpu": {"backend", "core"},
    "backend/cuda": {"backend", "core"},
    "monitor": {"backend", "io", "core"},
    "data": {"backend", "io", "core"},
    "model": {"backend", "io", "core"},
    "dist": {"core"},
    "runtime": {"model", "data", "dist", "backend", "io", "core"},
    "train": {"runtime", "model", "data", "monitor", "dist", "backend", "io", "core"},
    "serve": {"runtime", "model", "data", "backend", "io", "core"},
    "cli": {"train", "serve", "runtime", "model", "data", "monitor", "dist", "backend", "io", "core"},
    "python": {"cli", "train", "serve", "runtime", "model", "data", "monitor", "dist", "backend", "io", "core"},
}
EXCEPTIONS = {"backend/factory.cpp": {"backend/cpu", "backend/cuda"}}
# kernels whose body is one stage best read whole (docs/architecture.md names each): file, function name
KERNEL_EXCEPTIONS = {("backend/cuda/attention_tc.cu", "fwd_tile")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+(?:/(?:cpu|cuda))?)/[^"]+"')


def layer_of(rel):
    parts = rel.split("/")
    if parts[0] == "backend" and len(parts) > 2:
        return "backend/" + parts[1]
    return parts[0]


def sources():
    for dirpath, _, files in os.walk(SRC):
        for f in sorted(files):
            if f.endswith((".h", ".cpp", ".cu", ".cuh")):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, SRC), path


def check_layers(failures):
    n = 0
    for rel, path in sources():
        me = layer_of(rel)
        ok = ALLOWED[me] | {me} | EXCEPTIONS.get(rel, set())
        for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            n += 1
            target = m.group(1)
            if target.startswith("backend/") and target not in ALLOWED:
                target = "backend"
            if target not in ok:
                failures.append(f"src/{rel}:{lineno}: {me} includes {m.group(0).split()[-1]} ({target} is not below it)")
    print(f"{n} includes follow the layers" if not failures else "layering violations found")


def check_file_sizes(failures, limit=800):
    for rel, path in sources():
        lines = sum(1 for _ in open(path, encoding="utf-8"))
        if lines > limit:
            failures.append(f"src/{rel}: {lines} lines (at most {limit})")


SIGNATURE_END = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(->\s*[\w:<>]+\s*)?(:\s*.*)?\{\s*$")


def function_lengths(path):
    """(first line, signature, length) of each function defined at namespace level (bodies counted by braces);
    the signature is its last few lines, enough to hold the function's name."""
    out = []
    depth, ns_depth, start, name = 0, 0, None, ""
    recent = []
    for lineno, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = re.sub(r'"(\\.|[^"\\])*"', '""', raw.split("//")[0])
        recent = (recent + [raw.strip()])[-4:]
        if start is None and depth == ns_depth:
            if re.match(r"\s*namespace\b.*\{\s*$", line):
                ns_depth += 1
            elif SIGNATURE_END.search(line) and not re.match(r"\s*(struct|class|enum|union)\b", line):
                start, name = lineno, " ".join(recent)
        depth += line.count("{") - line.count("}")
        if start is not None and depth == ns_depth:
            out.append((start, name, lineno - start + 1))
            start = None
        ns_depth = min(ns_depth, depth)
    return out


def check_functions(failures, limit=80):
    n = 0
    for rel, path in sources():
        if not rel.endswith((".cpp", ".cu")):
            continue
        for start, name, length in function_lengths(path):
            n += 1
            excepted = any(rel == f and re.search(rf"\b{k}\b", name) for f, k in KERNEL_EXCEPTIONS)
            if length > limit and not excepted:
                failures.append(f"src/{rel}:{start}: {length} lines (at most {limit}): {name[-70:]}")
    print(f"{n} functions in src/ measured")


def main():
    failures = []
    check_layers(failures)
    check_file_sizes(failures)
    check_functions(failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED: layers, file sizes and function lengths hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
