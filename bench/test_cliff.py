#!/usr/bin/env python3
"""cliff_check.py on hand-made rows: a 50 % drop from 2 MiB to 4 MiB is
reported (and fails only with --strict), a second run of 8 MiB at half the
first run's busbw is reported as a run-to-run cliff, a smooth series and
sizes outside 1-256 MiB are not, and malformed input exits 2. With memcpy
rows (--memcpy-each-size): a drop memcpy shows too (the cache's edge, a
slower run) is a "memory:" line, not a cliff; one it does not show is a
cliff, judged against memcpy.

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


def with_memcpy(points):
    """(bytes, busbw, memcpy GB/s) points: the collective's rows and the memcpy rows."""
    return rows([(b, bw) for b, bw, _ in points]) + rows([(b, m) for b, _, m in points], algo="memcpy")


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
    assert any("at 8 MiB: runs of one size from 6.50 GB/s to 3.25 GB/s: 50 % lower" in c for c in cliffs), cliffs
    rc, cliffs = run("--strict", smooth)
    assert rc == 0 and cliffs == [], (rc, cliffs)
    assert run(bad)[0] == 2

    # Against memcpy: 16 -> 32 MiB busbw -40 % where memcpy fell -40 % (the
    # cache's edge): no cliff; 64 -> 128 MiB -40 % with memcpy flat: a cliff.
    m1, m2 = os.path.join(d, "m1.json"), os.path.join(d, "m2.json")
    open(m1, "w").write(with_memcpy([(16 * M, 10.0, 20.0), (32 * M, 6.0, 12.0), (64 * M, 6.0, 12.0),
                                     (128 * M, 3.6, 12.0)]))
    rc, cliffs = run(m1)
    assert rc == 0 and len(cliffs) == 1, cliffs
    assert "from 64 MiB (6.00 GB/s = 0.50 x memcpy) to 128 MiB (3.60 GB/s = 0.30 x memcpy): 40 % lower against memcpy" \
        in cliffs[0], cliffs
    out = subprocess.run([sys.executable, check, m1], capture_output=True, text=True).stdout
    assert "memory: broadcast shm np=2 direct f32 from 16 MiB" in out and "1 larger drop(s) that memcpy showed too" in out, out
    # A second run at half the speed with memcpy at half too (a slower
    # moment): no run-to-run cliff; at 16 MiB busbw halves, memcpy does not: one.
    open(m2, "w").write(with_memcpy([(16 * M, 5.0, 20.0), (32 * M, 3.0, 6.0), (64 * M, 3.0, 6.0),
                                     (128 * M, 1.8, 6.0)]))
    rc, cliffs = run(m1, m2)
    assert rc == 0 and len(cliffs) == 2, cliffs
    assert any("at 16 MiB: runs of one size from 10.00 GB/s = 0.50 x memcpy to 5.00 GB/s = 0.25 x memcpy: 50 % lower "
               "against memcpy" in c for c in cliffs), cliffs
print("ok")
