#!/usr/bin/env python3
"""Runs a gradsync-bench command with --inject-error (rank 0 corrupts one
result element per row) and checks the checker: every result row must report
exactly one wrong element and the run must exit with status 2.

usage: check_detects.py COMMAND... (the bench command line, without --json)"""
import json
import os
import subprocess
import sys
import tempfile


def run_json(argv):
    """Runs the bench command `argv` with --json into a temporary file, echoes
    its output; returns the finished process and the JSON rows it wrote."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rows.json")
        proc = subprocess.run(argv + ["--json", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=300)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        rows = []
        if os.path.exists(path):
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
    return proc, rows


def main(argv):
    if not argv:
        print(__doc__)
        return 1
    proc, rows = run_json(argv + ["--inject-error"])
    if proc.returncode != 2:
        print(f"expected exit status 2 (wrong results), got {proc.returncode}")
        return 1
    results = [r for r in rows if r["algo"] != "limit"]
    if not results:
        print("no result rows written")
        return 1
    bad = [r for r in results if r["wrong"] != 1]
    for r in bad:
        print(f"row {r['algo']} {r['bytes']} B reports wrong={r['wrong']}, expected 1")
    limits = [r for r in rows if r["algo"] == "limit"]
    if len(limits) != 1 or limits[0]["wrong"] is not None:
        print("expected one limit row with wrong = null")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
