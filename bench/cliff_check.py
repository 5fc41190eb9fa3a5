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
against them too: a cliff is a drop of busbw, and of busbw / memcpy, by more
than --drop each, so a step the memory has itself (the last-level cache's
edge) or a slower moment of a shared machine is not the collective's. Such
drops are listed as "memory:" lines instead. A memcpy that measured high in
one run never turns a busbw that held into a cliff.

A shared machine slows down for seconds at a time, so one slow row is not yet
a cliff. --points OUT writes each flagged point (ranks, collective, transport,
algorithm, bytes: one line each) for the caller to measure again standalone,
one process launch per size, as a user would (bench/suite.sh does, three times
per point); --rerun FILE... then gives those runs' JSON files (one run per file,
with their memcpy rows). A point stays a cliff only if its best rerun is
still more than --drop below the reference (the series' best run of that
size, or the size before's best run); otherwise it is listed as a
"transient:" line with the rerun's busbw. A transport whose speed depends on
what ran before (the standalone run slower than the sweep's) stays a cliff.

A report, not a test: the exit status is 0 whatever it finds (2 when the input
is malformed or holds no rows in range), so a noisy shared machine never fails
the suite; --strict makes cliffs exit 1.

usage: cliff_check.py [--lo BYTES] [--hi BYTES] [--drop FRACTION] [--strict]
                      [--points OUT] FILE.json... [--rerun FILE.json...]"""
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


def cliffs(rows, lo, hi, drop, reruns=()):
    """Every cliff in `rows` (each with its "file" index) as text lines, then
    the drops the memcpy rows explain, the number of series, the flagged
    points (series, bytes) and the lines of cliffs the `reruns` rows (the
    same fields, their own "file" indices) did not reproduce."""
    def collect(rs):
        copy = {}  # (file, transport, ranks, bytes) -> memcpy GB/s
        for r in rs:
            if r.get("algo") == "memcpy":
                copy[(r["file"], r["transport"], r["ranks"], r["bytes"])] = float(r["busbw_gbs"])
        by = defaultdict(lambda: defaultdict(list))  # series -> bytes -> [(busbw, memcpy or None)] in file order
        for r in rs:
            if lo <= r["bytes"] <= hi and r.get("algo") not in ("limit", "memcpy"):
                ref = copy.get((r["file"], r["transport"], r["ranks"], r["bytes"]))
                by[series_key(r)][r["bytes"]].append((float(r["busbw_gbs"]), ref if ref and ref > 0 else None))
        return by

    by, again = collect(rows), collect(reruns)
    out, memory, points, transient = [], [], [], []

    def judge(x, y):
        """How much lower y is than x (busbw, memcpy) pairs: raw, and against memcpy when both have it."""
        raw = 1 - y[0] / x[0] if x[0] > 0 else 0.0
        rel = 1 - (y[0] / y[1]) / (x[0] / x[1]) if x[0] > 0 and x[1] and y[1] else None
        return raw, rel

    def vs(v):
        return f"{v[0]:.2f} GB/s" + (f" = {v[0] / v[1]:.2f} x memcpy" if v[1] else "")

    def score(v):
        return v[0] / v[1] if v[1] else v[0]

    def steep(raw, rel):
        """busbw fell by more than `drop`, and (where memcpy was measured) by
        more than `drop` against memcpy too: memcpy can explain a drop away,
        never make one (a run whose memcpy measured high is no cliff when
        busbw itself held)."""
        return raw > drop and (rel is None or rel > drop)

    def report(raw, rel, text, key, b, ref):
        """A drop from `ref` to size b of series `key`: a cliff unless b's
        reruns come within `drop` of ref (then transient)."""
        if steep(raw, rel):
            lower = f"{100 * rel:.0f} % lower against memcpy" if rel is not None else f"{100 * raw:.0f} % lower"
            points.append((key, b))
            redo = again.get(key, {}).get(b, [])
            if redo:
                best = max(redo, key=score)
                if not steep(*judge(ref, best)):
                    transient.append(f"transient: {text}: {lower}; standalone reruns' best {vs(best)} "
                                     f"(of {len(redo)}), within {100 * drop:.0f} %")
                    return
                lower += f"; standalone reruns' best {vs(best)} (of {len(redo)}) still"
            out.append(f"cliff: {text}: {lower}")
        elif raw > drop:
            memory.append(f"memory: {text}: {100 * raw:.0f} % lower, {100 * rel:.0f} % against memcpy")

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
                report(raw, rel, f"{name(key)} at {human_bytes(b)}: runs of one size from {vs(best)} to {vs(worst)}",
                       key, b, best)
        for a, b in zip(sizes, sizes[1:]):  # from one size to the next (each size's best run)
            x, y = max(by[key][a], key=score), max(by[key][b], key=score)
            raw, rel = judge(x, y)
            report(raw, rel, f"{name(key)} from {human_bytes(a)} ({vs(x)}) to {human_bytes(b)} ({vs(y)})", key, b, x)
    return out, memory, len(by), sorted(set(points)), transient


def read_rows(paths, first_file=0):
    """The rows of gradsync-bench JSON files, each tagged with its file's
    index (from first_file); raises ValueError naming the file and line."""
    rows = []
    for i, path in enumerate(paths):
        try:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        row = json.loads(line)
                        row["file"] = first_file + i
                        for k in ("collective", "transport", "ranks", "algo", "bytes", "busbw_gbs"):
                            if k not in row:
                                raise ValueError(f"line {n} has no '{k}'")
                        rows.append(row)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from e
    return rows


def main(argv):
    lo, hi, drop, strict, paths, rerun_paths, points_out = 1 << 20, 256 << 20, 0.30, False, [], [], None
    it = iter(argv)
    target = paths
    for a in it:
        if a == "--lo":
            lo = parse_size(next(it))
        elif a == "--hi":
            hi = parse_size(next(it))
        elif a == "--drop":
            drop = float(next(it))
        elif a == "--strict":
            strict = True
        elif a == "--points":
            points_out = next(it)
        elif a == "--rerun":
            target = rerun_paths
        elif a.startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        else:
            target.append(a)
    try:
        rows = read_rows(paths)
        reruns = read_rows(rerun_paths, first_file=len(paths))
    except ValueError as e:
        print(f"cliff_check.py: {e}", file=sys.stderr)
        return 2
    found, memory, series, points, transient = cliffs(rows, lo, hi, drop, reruns)
    if series == 0:
        print(f"cliff_check.py: no rows between {human_bytes(lo)} and {human_bytes(hi)}", file=sys.stderr)
        return 2
    if points_out:
        with open(points_out, "w") as f:
            for (coll, transport, ranks, algo, _dtype, shared), b in points:
                if not shared:  # the suite's sweep: private buffers
                    f.write(f"{ranks} {coll} {transport} {algo} {b}\n")
    for line in found + transient + memory:
        print(line)
    print(f"# cliff check: {len(found)} cliff(s) over {series} series, busbw {human_bytes(lo)}..{human_bytes(hi)}, "
          f"drop limit {100 * drop:.0f} %" + (f"; {len(transient)} not reproduced by standalone reruns"
                                              if rerun_paths else "")
          + (f"; {len(memory)} larger drop(s) that memcpy showed too" if memory else ""))
    return 1 if strict and found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
