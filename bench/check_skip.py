#!/usr/bin/env python3
"""Checks gradsync-bench --skip-slower F: per size, a forced schedule runs
exactly when its model prediction is at most F times the best prediction of
the size's rows (read back from the printed model column), `auto` always
runs, skipped rows print "skipped" and stay out of the JSON.

usage: check_skip.py F COMMAND... (the bench command line, without
--skip-slower and --json)"""
import sys

from check_detects import run_json  # same folder


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 1
    factor = float(argv[0])
    proc, rows = run_json(argv[1:] + ["--skip-slower", argv[0]])
    if proc.returncode != 0:
        print(f"bench exited {proc.returncode}")
        return 1
    ran_json = {(r["bytes"], r["algo"]) for r in rows if r["algo"] != "limit"}
    table = {}  # bytes -> [(algo, time or None, model)]
    for line in proc.stdout.splitlines():
        f = line.split()
        if len(f) != 10 or not f[0].isdigit() or f[4] == "limit":
            continue
        algo = f[4].split(">")[0]
        table.setdefault(int(f[0]), []).append((algo, None if f[5] == "skipped" else float(f[5]),
                                                None if f[6] == "-" else float(f[6])))
    errors, skipped = [], 0
    for size, rs in table.items():
        best = min(m for _, _, m in rs if m is not None)
        for algo, t, m in rs:
            should_run = algo in ("auto", "native") or m is None or m <= factor * best * (1 + 1e-6)
            if (t is not None) != should_run:
                errors.append(f"{size} B {algo}: model {m} us, best {best} us, "
                              f"{'ran' if t is not None else 'skipped'}")
            if (t is not None) != ((size, algo) in ran_json):
                errors.append(f"{size} B {algo}: the JSON {'lacks' if t is not None else 'has'} it")
            skipped += t is None
    if not table:
        errors.append("no rows")
    if skipped == 0:
        errors.append("nothing was skipped: the check proves nothing")
    for e in errors:
        print("FAIL", e)
    print(f"{skipped} rows skipped over {len(table)} sizes")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
