#!/usr/bin/env python3
"""Rewrites a CUDA kernel source for cuemu (see cuemu.h): kernel launches become calls, dynamic shared
memory becomes the launch's buffer, cub comes from the emulator, and a reinterpret_cast checks
the alignment its type needs. Usage: rewrite.py IN.cu OUT.cpp"""
import re
import sys

def callee_start(src, end):
    """Index where the launched expression (a name, maybe qualified, maybe with template arguments) that ends
    just before `end` begins."""
    i = end
    while i > 0 and src[i - 1].isspace():
        i -= 1
    if src[i - 1] == '>':  # template arguments: back to the matching '<'
        depth = 0
        while True:
            i -= 1
            c = src[i]
            if c == '>':
                depth += 1
            elif c == '<':
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and (src[i - 1].isalnum() or src[i - 1] in '_:'):
        i -= 1
    return i


def balanced(src, start, open_ch, close_ch):
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(src)):
        if src[i] == open_ch:
            depth += 1
        elif src[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise SystemExit(f"cuemu rewrite: unbalanced {open_ch} at offset {start}")


def rewrite_launches(src):
    out = []
    pos = 0
    while True:
        at = src.find('<<<', pos)
        if at < 0:
            out.append(src[pos:])
            return ''.join(out)
        begin = callee_start(src, at)
        cfg_end = src.index('>>>', at)
        paren = cfg_end + 3
        while src[paren].isspace():
            paren += 1
        if src[paren] != '(':
            raise SystemExit(f"cuemu rewrite: no arguments after the launch at offset {at}")
        close = balanced(src, paren, '(', ')')
        callee = src[begin:at].strip()
        cfg = src[at + 3:cfg_end]
        args = src[paren + 1:close - 1].strip()
        out.append(src[pos:begin])
        out.append(f"::cuemu::launch_cfg({cfg})({callee}{', ' if args else ''}{args})")
        pos = close


def register_shared(match):
    """A static __shared__ declaration, plus a one-time registration of each array with the emulator, which
    fills them (arrays and single values alike) with 0xFF before every later block of the kernel (shared
    memory starts as garbage on a GPU)."""
    indent, type_, decls = match.group(1), match.group(2), match.group(3)
    names = [re.match(r'\s*(\w+)', d).group(1) for d in decls.split(',')]
    regs = ', '.join(f'::cuemu::register_shared(&{n}, sizeof {n})' for n in names)
    flag = f'cuemu_shared_{names[0]}_'  # one per declaration: a kernel may declare several
    return f'{indent}__shared__ {type_} {decls}; static const bool {flag} = ({regs}, true); (void){flag};'


def main():
    src = open(sys.argv[1]).read()
    src = re.sub(r'extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\s*\[\s*\]\s*;',
                 r'\1* \2 = static_cast<\1*>(::cuemu::dynamic_smem());', src)
    src = re.sub(r'^(\s*)__shared__\s+(\w+)\s+([^;]+);', register_shared, src, flags=re.M)
    src = re.sub(r'#include\s*<cub/cub\.cuh>', '#include "cub_shim.h"', src)
    # every cast checks its pointer's alignment for the type it names (cuemu::checked_cast)
    src = re.sub(r'\breinterpret_cast<', '::cuemu::checked_cast<', src)
    src = rewrite_launches(src)
    with open(sys.argv[2], 'w') as f:
        f.write(f'#line 1 "{sys.argv[1]}"\n')
        f.write(src)


if __name__ == '__main__':
    main()
