#!/usr/bin/env python3
"""Checks versus.py on hand-made rows: the ratio and memcpy fraction it prints
are the ones computed here, the fastest of repeated rows wins, tags tell runs
apart, and bad input exits 2. usage: test_versus.py VERSUS.py"""
import json
import os
import subprocess
import sys
import tempfile


def row(transport, algo, size, us, busbw):
    return {"collective": "allreduce", "transport": transport, "ranks": 2, "algo": algo, "bytes": size,
            "time_us": us, "busbw_gbs": busbw}


def run(script, *args):
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    script = sys.argv[1]
    d = tempfile.mkdtemp()
    a, b = os.path.join(d, "a.json"), os.path.join(d, "b.json")
    with open(a, "w") as f:
        for r in [row("shm", "auto", 1024, 10.0, 4.0), row("shm", "auto", 1024, 20.0, 1.0),  # slower repeat
                  row("shm", "auto", 2048, 10.0, 3.0), row("shm", "limit", 2048, 1.0, 12.0)]:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"attribute": "shm_copy", "value": "arena"}) + "\n")
    with open(b, "w") as f:
        for r in [row("mpi", "native", 1024, 20.0, 2.0), row("mpi", "native", 2048, 40.0, 1.5),
                  row("mpi", "limit", 1024, 1.0, 99.0),  # another run's limit: not ours
                  row("shm", "auto", 1024, 5.0, 8.0)]:
            f.write(json.dumps(r) + "\n")
    failures = []
    rc, out = run(script, "shm:auto:x", "mpi:native", "x=" + a, b)
    if rc != 0:
        failures.append(f"exit {rc}: {out}")
    want = ["| 1 KiB | 10.00 | 20.00 | 4.00 | 2.00 | 2.00x |", "| 2 KiB | 10.00 | 40.00 | 3.00 | 1.50 | 2.00x |",
            "shm:auto:x at 2 KiB: 3.00 GB/s = 0.25x the memcpy limit of the same run (12.00 GB/s)"]
    failures += [f"missing '{w}' in:\n{out}" for w in want if w not in out]
    if "99.00" in out:
        failures.append(f"used another run's memcpy limit:\n{out}")
    rc, out = run(script, "shm:auto", "mpi:native", a, b)  # untagged: b's faster shm row wins
    if "| 1 KiB | 5.00 | 20.00 | 8.00 | 2.00 | 4.00x |" not in out:
        failures.append(f"fastest row not kept:\n{out}")
    for args in (["shm:auto", "mpi:ring", a, b], ["shm", "mpi:native", a], ["shm:auto", "mpi:native", "/nonexistent"]):
        rc, out = run(script, *args)
        if rc != 2:
            failures.append(f"{args}: exit {rc}, want 2")
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        f.write("not json\n")
    if run(script, "shm:auto", "mpi:native", bad)[0] != 2:
        failures.append("malformed JSON not refused")
    for f_ in failures:
        print(f_)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
