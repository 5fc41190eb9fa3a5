#!/usr/bin/env python3
"""Looks for bandwidth cliffs in gradsync-bench JSON files (--json: one object
per line; issue 32): for every (collective, transport, ranks, algorithm, dtype,
shared buffers) series, busbw between --lo and --hi bytes (default 1 MiB and
256 MiB) should not drop by more than --drop (default 30 %) from one size to
the next larger one, nor between two runs of the same size (rows of the same
series given more than once: several files, or repeated runs). Prints every
cliff seen, one line each, and a summary line per file set.

Where a file has "memcpy" rows (gradsync-bench --memcpy-each-size: rank 0's
memcpy of each size, measured just before that size's rows), busbw is judged
against them: a cliff is a drop of busbw / memcpy, so a step the memory has
itself (the last-level cache's edge) or a slower moment of a shared machine
is not the collective's. Such drops are listed as "memory:" lines instead.

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
    """Every cliff in `rows` (each with its "file" index) as text lines, then
    the drops the memcpy rows explain, and the number of series."""
    copy = {}  # (file, transport, ranks, bytes) -> memcpy GB/s
    for r in rows:
        if r.get("algo") == "memcpy":
            copy[(r["file"], r["transport"], r["ranks"], r["bytes"])] = float(r["busbw_gbs"])
    by = defaultdict(lambda: defaultdict(list))  # series -> bytes -> [(busbw, memcpy or None)] in file order
    for r in rows:
        if lo <= r["bytes"] <= hi and r.get("algo") not in ("limit", "memcpy"):
            ref = copy.get((r["file"], r["transport"], r["ranks"], r["bytes"]))
            by[series_key(r)][r["bytes"]].append((float(r["busbw_gbs"]), ref if ref and ref > 0 else None))
    out, memory = [], []

    def judge(x, y):
        """How much lower y is than x (busbw, memcpy) pairs: raw, and against memcpy when both have it."""
        raw = 1 - y[0] / x[0] if x[0] > 0 else 0.0
        rel = 1 - (y[0] / y[1]) / (x[0] / x[1]) if x[0] > 0 and x[1] and y[1] else None
        return raw, rel

    def vs(v):
        return f"{v[0]:.2f} GB/s" + (f" = {v[0] / v[1]:.2f} x memcpy" if v[1] else "")

    def report(raw, rel, text):
        if (rel if rel is not None else raw) > drop:
            out.append("cliff: " + text + (f": {100 * rel:.0f} % lower against memcpy" if rel is not None else
                                           f": {100 * raw:.0f} % lower"))
        elif raw > drop:
            memory.append(f"memory: {text}: {100 * raw:.0f} % lower, {100 * rel:.0f} % against memcpy")

    def score(v):
        return v[0] / v[1] if v[1] else v[0]

    for key in sorted(by):
        sizes = sorted(by[key])
        for b in sizes:  # between runs of one size
            runs = by[key][b]
            if len(runs) > 1:
                best, worst = max(runs, key=score), min(runs, key=score)
                raw, rel = judge(best, worst)
                if rel is None and best[1] is None and worst[1] is None:
                    best, worst = max(runs), min(runs)
                    raw, rel = judge(best, worst)
                report(raw, rel, f"{name(key)} at {human_bytes(b)}: runs of one size from {vs(best)} to {vs(worst)}")
        for a, b in zip(sizes, sizes[1:]):  # from one size to the next (each size's best run)
            x, y = max(by[key][a], key=score), max(by[key][b], key=score)
            raw, rel = judge(x, y)
            report(raw, rel, f"{name(key)} from {human_bytes(a)} ({vs(x)}) to {human_bytes(b)} ({vs(y)})")
    return out, memory, len(by)


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
    rows, paths_read = [], []
    for path in paths:
        try:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        row = json.loads(line)
                        row["file"] = len(paths_read)
                        for k in ("collective", "transport", "ranks", "algo", "bytes", "busbw_gbs"):
                            if k not in row:
                                raise ValueError(f"line {n} has no '{k}'")
                        rows.append(row)
        except (OSError, ValueError) as e:
            print(f"cliff_check.py: {path}: {e}", file=sys.stderr)
            return 2
        paths_read.append(path)
    found, memory, series = cliffs(rows, lo, hi, drop)
    if series == 0:
        print(f"cliff_check.py: no rows between {human_bytes(lo)} and {human_bytes(hi)}", file=sys.stderr)
        return 2
    for line in found + memory:
        print(line)
    print(f"# cliff check: {len(found)} cliff(s) over {series} series, busbw {human_bytes(lo)}..{human_bytes(hi)}, "
          f"drop limit {100 * drop:.0f} %" + (f"; {len(memory)} larger drop(s) that memcpy showed too" if memory else ""))
    return 1 if strict and found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
