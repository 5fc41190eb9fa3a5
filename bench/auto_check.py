#!/usr/bin/env python3
"""Reads gradsync-bench JSON files (--json: one object per line) and prints,
for each (collective, transport, ranks), a markdown table with one line per
size: every algorithm's time in us with the calibrated model's prediction
beside it, the best fixed algorithm, -a auto's time and what it picked, auto's
time over the best fixed one, and a flag where that ratio exceeds 1.10. Then
a summary: at how many sizes auto is within 10 % of the best fixed algorithm.

"Fixed" means every gradsync algorithm named with -a except auto: `native`
(the MPI library's collective) is shown but is not a choice auto could make,
so it is not a candidate for the best. A (size, algorithm) given more than
once (several files, repeated runs) keeps its fastest row.

Speed is reported, never asserted: the exit status is 0 whatever the ratios,
2 when the input is malformed (not JSON, a key missing or of the wrong type,
no result rows), and with --strict 1 when the bench output is incomplete (a
gradsync row without `model_us`/`picked` keys, an allreduce row of a fixed
algorithm without a prediction, an auto row without `picked`, or a table with
no size that has both auto and a fixed algorithm).

usage: auto_check.py [--strict] FILE.json..."""
import json
import sys

REQUIRED = {"collective": str, "transport": str, "ranks": int, "algo": str, "bytes": int, "time_us": (int, float)}
NOT_FIXED = ("auto", "native", "dynamic")  # and any "KIND:NAME" row (native:dynamic, plan:auto): not a forced schedule of the call


def fixed(algo):
    """Whether a row is one forced schedule of the call auto is judged against."""
    return algo not in NOT_FIXED and ":" not in algo
LIMIT = 1.10


class Malformed(Exception):
    pass


def human_bytes(b):
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    v, u = float(b), 0
    while v >= 1024 and u < len(units) - 1:
        v /= 1024
        u += 1
    return f"{v:.0f} {units[u]}" if v == int(v) else f"{v:.1f} {units[u]}"


def us(v):
    """A time in us with about three significant digits."""
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def read_rows(paths):
    rows = []
    for path in paths:
        try:
            f = open(path)
        except OSError as e:
            raise Malformed(f"{path}: {e.strerror}")
        with f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise Malformed(f"{where}: not JSON ({e.msg})")
                if not isinstance(r, dict):
                    raise Malformed(f"{where}: not a JSON object")
                for key, kind in REQUIRED.items():
                    if key not in r:
                        raise Malformed(f"{where}: key '{key}' missing")
                    if not isinstance(r[key], kind) or isinstance(r[key], bool):
                        raise Malformed(f"{where}: key '{key}' has the wrong type ({type(r[key]).__name__})")
                model = r.get("model_us")
                if model is not None and (not isinstance(model, (int, float)) or isinstance(model, bool)):
                    raise Malformed(f"{where}: key 'model_us' is neither a number nor null")
                picked = r.get("picked")
                if picked is not None and not isinstance(picked, str):
                    raise Malformed(f"{where}: key 'picked' is neither a string nor null")
                if r["algo"] != "limit":
                    r["_where"] = where
                    rows.append(r)
    if not rows:
        raise Malformed("no result rows in " + " ".join(paths))
    return rows


def incomplete(r):
    """Why a row lacks what a current bench writes (None: complete)."""
    if r["algo"] == "native":
        return None
    for key in ("model_us", "picked"):
        if key not in r:
            return f"key '{key}' missing"
    if r["algo"] == "auto" and not r["picked"]:
        return "auto row without 'picked'"
    if r["collective"] == "allreduce" and r["algo"] != "auto" and r["model_us"] is None:
        return "allreduce row without a model prediction"
    return None


def tables(rows):
    """{(collective, transport, ranks): (algorithms in order, {bytes: {algo: row}})}"""
    out = {}
    for r in rows:
        key = (r["collective"], r["transport"], r["ranks"])
        algos, sizes = out.setdefault(key, ([], {}))
        if r["algo"] not in algos:
            algos.append(r["algo"])
        cell = sizes.setdefault(r["bytes"], {})
        if r["algo"] not in cell or r["time_us"] < cell[r["algo"]]["time_us"]:
            cell[r["algo"]] = r
    return out


def print_table(key, algos, sizes):
    """Prints one table; returns (sizes compared, sizes within LIMIT)."""
    collective, transport, ranks = key
    print(f"\n### {collective}, {transport}, {ranks} ranks\n")
    shown = [a for a in algos if a != "auto"]
    head = ["size"] + [f"{a} us (model)" for a in shown] + ["best fixed", "auto us (picked, model)", "auto/best", "flag"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---:"] * (len(head) - 1) + ["---"]) + "|")
    compared = within = 0
    worst = None
    for b in sorted(sizes):
        cell = sizes[b]
        line = [human_bytes(b)]
        for a in shown:
            r = cell.get(a)
            line.append("" if r is None else f"{us(r['time_us'])} ({us(r.get('model_us'))})")
        fixed_rows = [cell[a] for a in shown if fixed(a) and a in cell]
        best = min(fixed_rows, key=lambda r: r["time_us"]) if fixed_rows else None
        line.append(f"{best['algo']} {us(best['time_us'])}" if best else "-")
        auto = cell.get("auto")
        if auto is None:
            line.append("-")
        else:
            line.append(f"{us(auto['time_us'])} ({auto.get('picked') or '?'}, {us(auto.get('model_us'))})")
        if auto is not None and best is not None and best["time_us"] > 0:
            ratio = auto["time_us"] / best["time_us"]
            compared += 1
            within += ratio <= LIMIT
            if worst is None or ratio > worst[0]:
                worst = (ratio, b)
            line += [f"{ratio:.2f}", f"**> {LIMIT:.2f}**" if ratio > LIMIT else ""]
        else:
            line += ["-", ""]
        print("| " + " | ".join(line) + " |")
    summary = f"\nauto within {LIMIT - 1:.0%} of the best fixed algorithm at {within} of {compared} sizes"
    if worst is not None:
        summary += f" (worst: {worst[0]:.2f}x at {human_bytes(worst[1])})"
    print(summary)
    return compared, within


def main(argv):
    strict = "--strict" in argv
    paths = [a for a in argv if a != "--strict"]
    if not paths or any(p.startswith("-") for p in paths):
        print(__doc__)
        return 2
    try:
        rows = read_rows(paths)
    except Malformed as e:
        print(f"auto_check.py: malformed input: {e}", file=sys.stderr)
        return 2
    total = good = 0
    problems = []
    for key, (algos, sizes) in tables(rows).items():
        compared, within = print_table(key, algos, sizes)
        total += compared
        good += within
        if compared == 0:
            problems.append(f"{key}: no size has both auto and a fixed algorithm")
    print(f"\nsummary: auto within {LIMIT - 1:.0%} of the best fixed algorithm at {good} of {total} sizes")
    problems += [f"{r['_where']}: {why}" for r in rows if (why := incomplete(r))]
    if strict and problems:
        for p in problems:
            print(f"auto_check.py: incomplete: {p}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
