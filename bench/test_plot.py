#!/usr/bin/env python3
"""plot.py on bench/plot_sample.json (hand-made rows in the bench's JSON
format): the series each plot draws hold the values the rows say (repeats
keep the fastest, MPI native joins the shm plot, the memcpy line is the
run's limit, codecs at their largest size), and every plot is written as a
PNG of the expected size. Exits 77 only when matplotlib does not import.

usage: test_plot.py PLOT.py SAMPLE.json"""
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import matplotlib  # noqa: F401
except ImportError as e:
    print(f"skip: matplotlib does not import in {sys.executable}: {e}")
    sys.exit(77)

plot_py, sample = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("plot", plot_py)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)

M, K, G64 = 1 << 20, 1 << 10, 1 << 26
s = plot.series(plot.load([sample]))
want_files = {"busbw-allreduce-mpi-n2.png", "busbw-allreduce-shm-n2.png", "compressed-shm-n2.png",
              "codecs.png", "fusion-shm.png"}
assert set(s) == want_files, sorted(s)
mpi = s["busbw-allreduce-mpi-n2.png"]
assert mpi["lines"] == {"ring": [(K, 0.5), (M, 4.0), (G64, 6.0)]}, mpi["lines"]
assert mpi["refs"] == {"MPI native": [(K, 0.75), (M, 6.0), (G64, 9.0)]}, mpi["refs"]
assert mpi["memcpy"] == 12.0
shm = s["busbw-allreduce-shm-n2.png"]
assert set(shm["lines"]) == {"direct", "auto"} and shm["lines"]["direct"][1] == (M, 12.0), shm["lines"]
assert shm["refs"]["MPI native"][2] == (G64, 9.0)  # from the mpi rows
assert shm["memcpy"] == 12.0  # the larger of the two limit rows
comp = s["compressed-shm-n2.png"]
assert comp["lines"] == {"int8": [(M, 2.0)], "int8 (automatic)": [(M, 12.0)]}, comp["lines"]
assert comp["refs"]["dense (auto)"][1] == (M, 12.0)
codecs = s["codecs.png"]
assert codecs["bytes"] == {"int8": G64, "topk:density=0.01": G64, "fp16": G64}
assert codecs["bars"]["int8"] == (3.0, 5.0) and codecs["points"]["topk:density=0.01"] == (0.9, 0.02)
assert codecs["memcpy"] == 10.0
fusion = s["fusion-shm.png"]
assert fusion["bars"]["resnet50"] == {"per-tensor": 4000.0, "grouped": 1500.0, "engine": 1400.0}

# Rows from the 1 Gbit/s rig (a file named rig-*): plotted on their own, the
# dense and native lines from the same run, not from the shm-side mpi rows.
with tempfile.TemporaryDirectory() as d:
    rig = os.path.join(d, "rig-compressed.json")
    with open(rig, "w") as f:
        for algo, mode, codec, b, bw in [("auto", None, None, M, 0.05), ("auto", None, None, G64, 0.06),
                                         ("native", None, None, M, 0.04), ("native", None, None, G64, 0.055),
                                         ("z:int8", "always", "int8", M, 0.1), ("z:int8", "always", "int8", G64, 0.2),
                                         ("z:int8", "automatic", "int8", M, 0.05),
                                         ("z:int8", "automatic", "int8", G64, 0.19)]:
            row = {"collective": "allreduce", "transport": "mpi", "ranks": 2, "algo": algo, "bytes": b,
                   "busbw_gbs": bw}
            if mode:
                row.update(mode=mode, codec=codec)
            f.write(json.dumps(row) + "\n")
    r = plot.series(plot.load([sample, rig]))
    assert set(r) == want_files | {"busbw-allreduce-mpi-rig-n2.png", "compressed-mpi-rig-n2.png"}, sorted(r)
    c = r["compressed-mpi-rig-n2.png"]
    assert c["lines"] == {"int8": [(M, 0.1), (G64, 0.2)], "int8 (automatic)": [(M, 0.05), (G64, 0.19)]}, c["lines"]
    assert c["refs"] == {"dense (auto)": [(M, 0.05), (G64, 0.06)], "MPI native": [(M, 0.04), (G64, 0.055)]}, c["refs"]
    assert r["busbw-allreduce-mpi-n2.png"]["refs"]["MPI native"] == mpi["refs"]["MPI native"]  # not the rig's

with tempfile.TemporaryDirectory() as out:
    r = subprocess.run([sys.executable, plot_py, out, sample], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    printed = {os.path.basename(p) for p in r.stdout.split()}
    assert printed == want_files, printed
    for f in want_files:
        data = open(os.path.join(out, f), "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{f} is not a PNG"
        w, h = struct.unpack(">II", data[16:24])  # IHDR: figsize x dpi 100
        assert (w, h) == ((1200, 500) if f == "codecs.png" else (800, 500)), (f, w, h)
    # No plottable rows, and a malformed line: exit status 2.
    empty = os.path.join(out, "empty.json")
    open(empty, "w").write('{"note": "attributes only"}\n')
    assert subprocess.run([sys.executable, plot_py, out, empty], capture_output=True).returncode == 2
    bad = os.path.join(out, "bad.json")
    open(bad, "w").write("{not json\n")
    assert subprocess.run([sys.executable, plot_py, out, bad], capture_output=True).returncode == 2
print("ok")
