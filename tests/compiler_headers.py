#!/usr/bin/env python3
"""Checks that every given public header compiles with a compiler.

    compiler_headers.py [--each] CXX INCLUDE_DIR [-I DIR]... HEADER...

Two uses (tests/meson.build): with the build's own compiler and --each,
that every header compiles on its own (one `-fsyntax-only` translation unit
per header: it includes what it uses; ~0.7 s each with clang++ 14, about
40 s of the 2-core test budget; a static library of one object per header
cost ~220 s to build, and `meson test` never built it); without --each, with
the other compiler (clang++ where the build uses g++, g++ where it uses
clang++): users build with either, and one unit per core is enough there
(one per header with g++ cost 70 s against about 10).

C++20, -Wall -Wextra -Wpedantic -Werror; each header is included twice (its
include guard works). A failing chunk is rechecked header by header, so the
report names the headers that fail, with the compiler's output; then the
script exits 1.
"""
import concurrent.futures
import os
import subprocess
import sys


def main() -> int:
    args = sys.argv[1:]
    each = bool(args) and args[0] == "--each"
    if each:
        args = args[1:]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    otherxx, include, rest = args[0], args[1], args[2:]
    extra, headers = [], []
    while rest:
        arg = rest.pop(0)
        if arg == "-I":
            extra.append("-I" + rest.pop(0))
        else:
            headers.append(arg)
    if not headers:
        print("no headers given", file=sys.stderr)
        return 1
    flags = ["-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
             "-I" + include, *extra, "-x", "c++", "-"]

    def check(chunk):
        src = "".join(f"#include <{h}>\n#include <{h}>\n" for h in chunk)
        r = subprocess.run([otherxx, *flags], input=src, capture_output=True, text=True)
        return chunk, r.returncode, r.stdout + r.stderr

    workers = max(1, os.cpu_count() or 1)
    chunks = [[h] for h in headers] if each else [headers[i::workers] for i in range(workers) if headers[i::workers]]
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        bad = [chunk for chunk, rc, _ in pool.map(check, chunks) if rc != 0]
        for chunk in bad:  # name the headers: one run each
            for header, rc, out in pool.map(lambda h: (h, *check([h])[1:]), chunk):
                if rc != 0:
                    failed += 1
                    print(f"FAIL {header}\n{out}")
    if bad and not failed and not each:  # only together: report the chunk's output
        for chunk in bad:
            failed += 1
            print(f"FAIL (only when included together) {' '.join(chunk)}\n{check(chunk)[2]}")
    for h in headers:
        print(f"checked {h}")
    print(f"{len(headers) - failed} of {len(headers)} headers compile with {otherxx}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
