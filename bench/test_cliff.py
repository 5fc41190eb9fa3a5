#!/usr/bin/env python3
"""cliff_check.py on hand-made rows: a 50 % drop from 2 MiB to 4 MiB is
reported (and fails only with --strict), a second run of 8 MiB at half the
first run's busbw is reported as a run-to-run cliff, a smooth series and
sizes outside 1-256 MiB are not, and malformed input exits 2. With memcpy
rows (--memcpy-each-size): a drop memcpy shows too (the cache's edge, a
slower run) is a "memory:" line, not a cliff; one it does not show is a
cliff, judged against memcpy; busbw that held is no cliff whatever memcpy did. --points lists each flagged point; with
--rerun, a point whose standalone rerun comes back within 30 % is a
"transient:" line, and one whose rerun stays low is still a cliff.

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

    # busbw that held (6.45 then 6.93 GB/s at 8 MiB) while one run's memcpy
    # measured three times higher (a cache-edge size): no cliff, though
    # busbw / memcpy fell 64 % (README's bench run, 2026-12-06 18:06).
    h1, h2 = os.path.join(d, "h1.json"), os.path.join(d, "h2.json")
    open(h1, "w").write(with_memcpy([(8 * M, 6.45, 10.0)]))
    open(h2, "w").write(with_memcpy([(8 * M, 6.93, 30.0)]))
    rc, cliffs = run(h1, h2)
    assert rc == 0 and cliffs == [], cliffs

    # Reruns: the 2 -> 4 MiB step (6.0 -> 3.0) and 8 MiB's run-to-run drop
    # (6.5 -> 3.25) of one + two. --points names both points.
    pts_file = os.path.join(d, "points.txt")
    rc, cliffs = run("--points", pts_file, one, two)
    assert rc == 0 and len(cliffs) == 2, cliffs
    assert open(pts_file).read().splitlines() == [f"2 broadcast shm direct {4 * M}", f"2 broadcast shm direct {8 * M}"]
    # A rerun of 4 MiB at 5.0 (within 30 % of 2 MiB's 6.0): transient; two
    # reruns of 8 MiB at 3.0 and 4.0 (best 4.0, 38 % below 6.5): still a cliff.
    r1, r2, r3 = (os.path.join(d, f"r{i}.json") for i in (1, 2, 3))
    open(r1, "w").write(rows([(4 * M, 5.0)]))
    open(r2, "w").write(rows([(8 * M, 3.0)]))
    open(r3, "w").write(rows([(8 * M, 4.0)]))
    out = subprocess.run([sys.executable, check, one, two, "--rerun", r1, r2, r3], capture_output=True, text=True).stdout
    cl = [l for l in out.splitlines() if l.startswith("cliff:")]
    tr = [l for l in out.splitlines() if l.startswith("transient:")]
    assert len(cl) == 1 and "at 8 MiB: runs of one size from 6.50 GB/s to 3.25 GB/s: 50 % lower; standalone reruns' " \
        "best 4.00 GB/s (of 2) still" in cl[0], out
    assert len(tr) == 1 and "from 2 MiB (6.00 GB/s) to 4 MiB (3.00 GB/s): 50 % lower; standalone reruns' best " \
        "5.00 GB/s (of 1), within 30 %" in tr[0], out
    assert "# cliff check: 1 cliff(s)" in out and "1 not reproduced by standalone reruns" in out, out
    rc, _ = run("--strict", one, two, "--rerun", r1, r2, r3)
    assert rc == 1
    # Against memcpy: the rerun is judged by its own memcpy rows. 64 -> 128
    # MiB in m1 is 0.50 -> 0.30 x memcpy; a rerun at 3.0 GB/s with memcpy 6.0
    # (0.50 x: a slow moment of the machine, same ratio) is transient.
    r4 = os.path.join(d, "r4.json")
    open(r4, "w").write(with_memcpy([(128 * M, 3.0, 6.0)]))
    out = subprocess.run([sys.executable, check, m1, "--rerun", r4], capture_output=True, text=True).stdout
    assert "# cliff check: 0 cliff(s)" in out and "transient: broadcast shm np=2 direct f32 from 64 MiB" in out \
        and "best 3.00 GB/s = 0.50 x memcpy (of 1)" in out, out
print("ok")
