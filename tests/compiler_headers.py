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
include guard works).

With clang++ and --each, the standard headers come precompiled: a unit
starts from a PCH holding standard headers that the header would include
anyway (a subset of the ones its own unconditional #include lines reach,
through gradsync's headers, before any #define), so the check is the same as
without it while each unit skips most of its parsing (~2.5 s -> ~1.3 s for
collectives.hpp). A few PCHs are built, chosen greedily to cover the most. A failing chunk is rechecked header by header, so the
report names the headers that fail, with the compiler's output; then the
script exits 1.
"""
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile


def is_clang(cxx):
    r = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return r.returncode == 0 and "clang" in r.stdout


def scan(include, header):
    """The standard headers and gradsync headers `header` includes outside
    any #if, up to its first #define."""
    std, own, depth = set(), set(), 0
    with open(os.path.join(include, header), encoding="utf-8") as f:
        for line in f:
            t = line.strip()
            if re.match(r"#\s*if", t):
                depth += 1
            elif re.match(r"#\s*endif", t):
                depth -= 1
            elif depth == 0 and re.match(r"#\s*define", t):
                break
            elif depth == 0 and (m := re.match(r'#\s*include\s*([<"])([^>"]+)[>"]', t)):
                kind, name = m.groups()
                if kind == '"':
                    own.add(os.path.normpath(os.path.join(os.path.dirname(header), name)))
                elif name.startswith("gradsync/"):
                    own.add(name)
                elif "/" not in name and "." not in name:
                    std.add(name)
    return std, own


def precompile(cxx, common, include, headers, tmp, count=6):
    """PCHs of standard headers; for each header the largest one whose
    headers all are among those it reaches (its path, or no entry)."""
    scanned, reach = {}, {}
    for h in headers:
        seen, todo, std = set(), [h], set()
        while todo:
            x = todo.pop()
            if x in seen or not os.path.exists(os.path.join(include, x)):
                continue
            seen.add(x)
            if x not in scanned:
                scanned[x] = scan(include, x)
            std |= scanned[x][0]
            todo += scanned[x][1]
        reach[h] = frozenset(std)
    chosen, best = [], {h: 0 for h in headers}
    for _ in range(count):  # greedy: the set that adds the most covered headers
        gain = {}
        for cand in set(reach.values()):
            gain[cand] = sum(len(cand) - best[h] for h in headers if cand <= reach[h] and len(cand) > best[h])
        cand = max(gain, key=gain.get, default=None)
        if not cand or gain[cand] <= 0:
            break
        chosen.append(cand)
        for h in headers:
            if cand <= reach[h]:
                best[h] = max(best[h], len(cand))

    def build(i):
        src = os.path.join(tmp, f"std{i}.hpp")
        with open(src, "w", encoding="utf-8") as f:
            f.writelines(f"#include <{n}>\n" for n in sorted(chosen[i]))
        out = src + ".pch"
        r = subprocess.run([cxx, *common, "-x", "c++-header", src, "-o", out], capture_output=True, text=True)
        return out if r.returncode == 0 else None

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        built = list(pool.map(build, range(len(chosen))))
    out = {}
    for h in headers:
        fits = [i for i, c in enumerate(chosen) if built[i] and c <= reach[h]]
        if fits:
            out[h] = built[max(fits, key=lambda i: len(chosen[i]))]
    return out


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
    common = ["-std=c++20", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
    flags = [*common, "-fsyntax-only", "-I" + include, *extra, "-x", "c++", "-"]
    tmp = tempfile.TemporaryDirectory()
    pch = precompile(otherxx, common, include, headers, tmp.name) if each and is_clang(otherxx) else {}

    def check(chunk):
        src = "".join(f"#include <{h}>\n#include <{h}>\n" for h in chunk)
        pre = ["-include-pch", pch[chunk[0]]] if len(chunk) == 1 and chunk[0] in pch else []
        r = subprocess.run([otherxx, *pre, *flags], input=src, capture_output=True, text=True)
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
