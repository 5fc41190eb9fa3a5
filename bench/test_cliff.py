#!/usr/bin/env python3
"""cliff_check.py on hand-made rows: a 50 % drop from 2 MiB to 4 MiB is
reported (and fails only with --strict), a second run of 8 MiB at half the
first run's busbw is reported as a run-to-run cliff, a smooth series and
sizes outside 1-256 MiB are not, and malformed input exits 2.

usage: test_cliff.py CLIFF_CHECK.py"""
import json
import os
import subprocess
import sys
import tempfile

check = sys.argv[1]
M = 1 << 20


def rows(points, algo="direct"):
    return "".join(json.dumps({"collective": "broadcast", "transport": "shm", "ranks": 2, "algo": algo,
                               "dtype": "f32", "bytes": b, "busbw_gbs": bw}) + "\n" for b, bw in points)


def run(*args):
    r = subprocess.run([sys.executable, check, *args], capture_output=True, text=True)
    return r.returncode, [l for l in r.stdout.splitlines() if l.startswith("cliff:")]


with tempfile.TemporaryDirectory() as d:
    one, two, smooth, bad = (os.path.join(d, n) for n in ("one.json", "two.json", "smooth.json", "bad.json"))
    pts = [(M, 5.0), (2 * M, 6.0), (4 * M, 3.0), (8 * M, 6.5), (512 * M, 0.1)]  # 512 MiB: out of range
    open(one, "w").write(rows(pts))
    open(two, "w").write(rows([(b, bw / 2 if b == 8 * M else bw) for b, bw in pts]))
    open(smooth, "w").write(rows([(M, 5.0), (2 * M, 4.0), (4 * M, 3.2), (8 * M, 3.3)]))  # -20 % at most
    open(bad, "w").write("{not json\n")

    rc, cliffs = run(one)
    assert rc == 0 and len(cliffs) == 1 and "from 2 MiB (6.00 GB/s) to 4 MiB (3.00 GB/s): 50 % lower" in cliffs[0], cliffs
    rc, cliffs = run("--strict", one)
    assert rc == 1 and len(cliffs) == 1, (rc, cliffs)
    rc, cliffs = run(one, two)
    assert rc == 0 and len(cliffs) == 2, cliffs
    assert any("at 8 MiB: runs of one size from 6.50 to 3.25 GB/s (50 % lower)" in c for c in cliffs), cliffs
    rc, cliffs = run("--strict", smooth)
    assert rc == 0 and cliffs == [], (rc, cliffs)
    assert run(bad)[0] == 2
print("ok")
