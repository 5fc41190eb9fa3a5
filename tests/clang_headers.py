#!/usr/bin/env python3
"""Checks that every given public header compiles on its own with clang++.

    clang_headers.py CLANGXX INCLUDE_DIR [-I DIR]... HEADER...

Each header gets its own `-fsyntax-only` run (C++20, -Wall -Wextra -Wpedantic
-Werror: g++ is not the only compiler users have). Every failing header is
reported with clang's output, then the script exits 1.
"""
import concurrent.futures
import os
import subprocess
import sys


def main() -> int:
    clangxx, include, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
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

    def check(header):
        src = f"#include <{header}>\n#include <{header}> // include guard works\n"
        r = subprocess.run([clangxx, *flags], input=src, capture_output=True, text=True)
        return header, r.returncode, r.stdout + r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for header, rc, out in pool.map(check, headers):
            if rc != 0:
                failed += 1
                print(f"FAIL {header}\n{out}")
            else:
                print(f"ok   {header}")
    print(f"{len(headers) - failed} of {len(headers)} headers compile with {clangxx}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
