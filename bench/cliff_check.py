#!/usr/bin/env python3
"""Looks for bandwidth cliffs in gradsync-bench JSON files (--json: one object
per line; issue 32): for every (collective, transport, ranks, algorithm, dtype,
shared buffers) series, busbw between --lo and --hi bytes (default 1 MiB and
256 MiB) should not drop by more than --drop (default 30 %) from one size to
the next larger one, nor between two runs of the same size (rows of the same
series given more than once: several files, or repeated runs). Prints every
cliff seen, one line each, and a summary line per file set.

A report, not a test: the exit status is 0 whatever it finds (2 when the input
is malformed or holds no rows in range), so a noisy shared machine never fails
the suite; --strict makes cliffs exit 1.

usage: cliff_check.py [--lo BYTES] [--hi BYTES] [--drop FRACTION] [--strict] FILE.json..."""
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from auto_check import human_bytes  # noqa: E402  (one size formatter for the bench's tables)


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult != 1 else s) * mult


def series_key(row):
    buffers = row.get("buffers", "")
    return (row["collective"], row["transport"], row["ranks"], row["algo"], row.get("dtype", "?"),
            "shared buffers" if buffers.startswith("shared") else "")


def name(key):
    coll, transport, ranks, algo, dtype, shared = key
    return f"{coll} {transport} np={ranks} {algo} {dtype}" + (f" {shared}" if shared else "")


def cliffs(rows, lo, hi, drop):
    """Every cliff in `rows` as text lines."""
    by = defaultdict(lambda: defaultdict(list))  # series -> bytes -> [busbw in file order]
    for r in rows:
        if lo <= r["bytes"] <= hi and r.get("algo") != "limit":
            by[series_key(r)][r["bytes"]].append(float(r["busbw_gbs"]))
    out = []
    for key in sorted(by):
        sizes = sorted(by[key])
        for b in sizes:  # between runs of one size
            runs = by[key][b]
            best, worst = max(runs), min(runs)
            if len(runs) > 1 and best > 0 and worst < (1 - drop) * best:
                out.append(f"cliff: {name(key)} at {human_bytes(b)}: runs of one size from {best:.2f} to "
                           f"{worst:.2f} GB/s ({100 * (1 - worst / best):.0f} % lower)")
        for a, b in zip(sizes, sizes[1:]):  # from one size to the next
            x, y = max(by[key][a]), max(by[key][b])
            if x > 0 and y < (1 - drop) * x:
                out.append(f"cliff: {name(key)} from {human_bytes(a)} ({x:.2f} GB/s) to {human_bytes(b)} "
                           f"({y:.2f} GB/s): {100 * (1 - y / x):.0f} % lower")
    return out, len(by)


def main(argv):
    lo, hi, drop, strict, paths = 1 << 20, 256 << 20, 0.30, False, []
    it = iter(argv)
    for a in it:
        if a == "--lo":
            lo = parse_size(next(it))
        elif a == "--hi":
            hi = parse_size(next(it))
        elif a == "--drop":
            drop = float(next(it))
        elif a == "--strict":
            strict = True
        elif a.startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        else:
            paths.append(a)
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        row = json.loads(line)
                        for k in ("collective", "transport", "ranks", "algo", "bytes", "busbw_gbs"):
                            if k not in row:
                                raise ValueError(f"line {n} has no '{k}'")
                        rows.append(row)
        except (OSError, ValueError) as e:
            print(f"cliff_check.py: {path}: {e}", file=sys.stderr)
            return 2
    found, series = cliffs(rows, lo, hi, drop)
    if series == 0:
        print(f"cliff_check.py: no rows between {human_bytes(lo)} and {human_bytes(hi)}", file=sys.stderr)
        return 2
    for line in found:
        print(line)
    print(f"# cliff check: {len(found)} cliff(s) over {series} series, busbw {human_bytes(lo)}..{human_bytes(hi)}, "
          f"drop limit {100 * drop:.0f} %")
    return 1 if strict and found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
