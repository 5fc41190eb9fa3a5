#!/usr/bin/env python3
"""Side by side: reads gradsync-bench JSON files (--json: one object per line)
and prints a markdown table, one line per size, of one row kind against
another: time in us and busbw in GB/s of each, and ours over theirs in busbw
(> 1: ours moves more per second). Then, for every size where the file our
row came from holds a memcpy limit row (algo `limit`), busbw over that limit
of the same run.

A kind is TRANSPORT:ALGO[:TAG], e.g. shm:auto or mpi:native; TAG names the
file a row came from (FILE.json given as TAG=FILE.json) so that two runs of
one transport and algorithm can be told apart. A (kind, size) given more than
once keeps its fastest row.

Speed is reported, never asserted: the exit status is 0 whatever the ratios,
2 when the input is malformed or a kind has no rows.

usage: versus.py OURS THEIRS [TAG=]FILE.json..."""
import json
import sys

from auto_check import human_bytes


def load(args):
    rows, limits = {}, {}
    for fi, a in enumerate(args):
        tag, _, path = a.rpartition("=")
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if "algo" not in r:
                    continue  # run attributes and calibration lines
                b, t = int(r["bytes"]), float(r["time_us"])
                if r["algo"] == "limit":
                    limits[(fi, b)] = float(r["busbw_gbs"])
                    continue
                for key in ((r["transport"], r["algo"], tag), (r["transport"], r["algo"], "")):
                    if key not in rows:
                        rows[key] = {}
                    old = rows[key].get(b)
                    if old is None or t < old[0]:
                        rows[key][b] = (t, float(r["busbw_gbs"]), fi)
    return rows, limits


def kind(s):
    parts = s.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"kind '{s}' is not TRANSPORT:ALGO[:TAG]")
    return (parts[0], parts[1], parts[2] if len(parts) == 3 else "")


def main(argv):
    if len(argv) < 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        ours, theirs = kind(argv[1]), kind(argv[2])
        rows, limits = load(argv[3:])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"versus.py: {e}", file=sys.stderr)
        return 2
    for k in (ours, theirs):
        if k not in rows:
            print(f"versus.py: no rows of {':'.join(k)}", file=sys.stderr)
            return 2
    a, b = rows[ours], rows[theirs]
    name_a, name_b = ":".join(x for x in ours if x), ":".join(x for x in theirs if x)
    print(f"| size | {name_a} us | {name_b} us | {name_a} busbw | {name_b} busbw | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in sorted(set(a) & set(b)):
        (ta, ga, _), (tb, gb, _) = a[size], b[size]
        ratio = ga / gb if gb > 0 else float("inf")
        print(f"| {human_bytes(size)} | {ta:.2f} | {tb:.2f} | {ga:.2f} | {gb:.2f} | {ratio:.2f}x |")
    for size in sorted(a):
        lim = limits.get((a[size][2], size))
        if lim:
            print(f"\n{name_a} at {human_bytes(size)}: {a[size][1]:.2f} GB/s = {a[size][1] / lim:.2f}x "
                  f"the memcpy limit of the same run ({lim:.2f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
