#!/usr/bin/env python3
"""PNG plots from gradsync-bench JSON (--json: one object per line).

usage: plot.py OUTDIR FILE.json...

Writes into OUTDIR:
  busbw-COLLECTIVE-TRANSPORT-nRANKS.png  busbw against message size, one line
      per algorithm, with MPI's own collective (algo `native`, from any file
      of the same collective and rank count) and the run's memcpy limit
      (algo `limit`) as dashed lines;
  compressed-TRANSPORT-nRANKS.png  compressed allreduce rows (algo z:CODEC):
      busbw against size per codec (always, and where `automatic` decides)
      beside the dense auto row and MPI's own allreduce of the same run;
  codecs.png  from `compress` rows: encode and decode GB/s per codec at its
      largest size, and payload ratio against relative L2 error;
  fusion-TRANSPORT.png  from `fusion` rows: time per step of each mode
      (per-tensor, grouped, engine) per workload.
Rows of a file whose name starts with `rig-` ran across bench/netrig.sh's
1 Gbit/s link: their transport gets the suffix `-rig`, so they are plotted
apart from the same transport's shared-memory runs (busbw-*-mpi-rig-n2.png,
compressed-mpi-rig-n2.png: dense, MPI native and each codec from that run).
Prints the files written. Exit status 2 when no row could be plotted or an
input is malformed. series() returns what each plot draws (for tests)."""
import json
import os
import sys
from collections import defaultdict


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON: {e}") from e
                if os.path.basename(path).startswith("rig-") and isinstance(r, dict) and "transport" in r:
                    r["transport"] = r["transport"] + "-rig"
                rows.append(r)
    return rows


def _fastest(points):
    """{size: busbw} keeping the best of repeated sizes, as sorted (size, busbw) pairs."""
    best = {}
    for b, v in points:
        best[b] = max(v, best.get(b, 0.0))
    return sorted(best.items())


def site_of(transport):
    """"-rig" for rows from the 1 Gbit/s rig (see load), else ""."""
    return "-rig" if transport.endswith("-rig") else ""


def series(rows):
    """What each plot draws: {filename: {"kind": ..., "lines" | "bars" | "points": ...}}."""
    plots = {}
    coll = defaultdict(lambda: defaultdict(list))  # (collective, transport, ranks) -> algo -> [(bytes, busbw)]
    native = defaultdict(list)  # (collective, ranks, site) -> [(bytes, busbw)]; site "-rig" or ""
    limits = defaultdict(float)  # (collective, transport, ranks) -> memcpy GB/s
    comp = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if "collective" not in r or "algo" not in r:
            continue
        key = (r["collective"], r["transport"], int(r["ranks"]))
        algo, b, bw = r["algo"], int(r["bytes"]), float(r["busbw_gbs"])
        if algo == "limit":
            limits[key] = max(limits[key], bw)
        elif algo.startswith("z:"):
            mode = r.get("mode")
            label = "dense, in place" if mode == "never" else r.get("codec", algo[2:]) + (" (automatic)" if mode == "automatic" else "")
            comp[key][label].append((b, bw))
        elif algo == "native":
            native[(key[0], key[2], site_of(key[1]))].append((b, bw))
        else:
            coll[key][algo].append((b, bw))
    for key, algos in coll.items():
        c, t, p = key
        lines = {a: _fastest(pts) for a, pts in sorted(algos.items())}
        refs = {}
        if native.get((c, p, site_of(t))):
            refs["MPI native"] = _fastest(native[(c, p, site_of(t))])
        plots[f"busbw-{c}-{t}-n{p}.png"] = {"kind": "busbw", "title": f"{c} over {t}, {p} ranks",
                                           "lines": lines, "refs": refs, "memcpy": limits.get(key)}
    for (c, t, p), codecs in comp.items():
        lines = {z: _fastest(pts) for z, pts in sorted(codecs.items())}
        dense = coll.get((c, t, p), {}).get("auto")
        refs = {"dense (auto)": _fastest(dense)} if dense else {}
        if native.get((c, p, site_of(t))):
            refs["MPI native"] = _fastest(native[(c, p, site_of(t))])
        plots[f"compressed-{t}-n{p}.png"] = {"kind": "busbw", "title": f"compressed {c} over {t}, {p} ranks",
                                            "lines": lines, "refs": refs, "memcpy": limits.get((c, t, p))}
    codec_rows = [r for r in rows if "codec" in r and "encode_gbs" in r]
    if codec_rows:
        largest = {}
        for r in codec_rows:
            z = r["codec"]
            if z not in largest or int(r["bytes"]) > int(largest[z]["bytes"]):
                largest[z] = r
        zs = sorted(largest)
        plots["codecs.png"] = {
            "kind": "codecs",
            "bars": {z: (float(largest[z]["encode_gbs"]), float(largest[z]["decode_gbs"])) for z in zs},
            "points": {z: (float(largest[z]["rel_l2_error"]), float(largest[z]["ratio"])) for z in zs},
            "memcpy": max(float(largest[z]["memcpy_gbs"]) for z in zs),
            "bytes": {z: int(largest[z]["bytes"]) for z in zs}}
    fusion = defaultdict(lambda: defaultdict(dict))  # transport -> workload -> mode -> us
    for r in rows:
        if r.get("bench") == "fusion":
            m = r["mode"] + ("" if r.get("compression", "none") == "none" else f" {r['compression']}")
            old = fusion[r["transport"]][r["workload"]].get(m)
            fusion[r["transport"]][r["workload"]][m] = min(float(r["time_us"]), old if old is not None else float("inf"))
    for t, w in fusion.items():
        plots[f"fusion-{t}.png"] = {"kind": "fusion", "title": f"tensor fusion over {t}",
                                    "bars": {k: dict(v) for k, v in sorted(w.items())}}
    return plots


def human(b):
    for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s}{unit}"
    return str(b)


def draw(name, spec, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = os.path.join(outdir, name)
    if spec["kind"] == "busbw":
        fig, ax = plt.subplots(figsize=(8, 5))
        sizes = set()
        for label, pts in spec["lines"].items():
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", markersize=3, label=label)
            sizes.update(b for b, _ in pts)
        for label, pts in spec["refs"].items():
            ax.plot([b for b, _ in pts], [v for _, v in pts], "k--", linewidth=1.5, label=label)
        if spec["memcpy"]:
            ax.axhline(spec["memcpy"], color="gray", linestyle=":", linewidth=1.5,
                       label=f"memcpy ({spec['memcpy']:.1f} GB/s)")
        ax.set_xscale("log", base=2)
        ticks = sorted(sizes)[::max(1, len(sizes) // 8)]
        ax.set_xticks(ticks, [human(b) for b in ticks])
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(spec["title"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    elif spec["kind"] == "codecs":
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5))
        zs = list(spec["bars"])
        xs = range(len(zs))
        a1.bar([x - 0.2 for x in xs], [spec["bars"][z][0] for z in zs], 0.4, label="encode")
        a1.bar([x + 0.2 for x in xs], [spec["bars"][z][1] for z in zs], 0.4, label="decode")
        a1.axhline(spec["memcpy"], color="gray", linestyle=":", label=f"memcpy ({spec['memcpy']:.1f} GB/s)")
        a1.set_xticks(list(xs), zs, rotation=45, ha="right", fontsize=8)
        a1.set_ylabel("GB/s of input")
        a1.set_title("codec throughput (largest size)")
        a1.legend(fontsize=8)
        for z, (err, ratio) in spec["points"].items():
            a2.scatter([max(err, 1e-9)], [ratio])
            a2.annotate(z, (max(err, 1e-9), ratio), fontsize=7, xytext=(3, 3), textcoords="offset points")
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set_xlabel("relative L2 error")
        a2.set_ylabel("payload / input bytes")
        a2.set_title("compression ratio against error")
        a2.grid(True, alpha=0.3)
        fig.tight_layout()
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
        workloads = list(spec["bars"])
        modes = sorted({m for w in workloads for m in spec["bars"][w]})
        width = 0.8 / max(1, len(modes))
        for i, m in enumerate(modes):
            ax.bar([j + (i - (len(modes) - 1) / 2) * width for j in range(len(workloads))],
                   [spec["bars"][w].get(m, 0.0) for w in workloads], width, label=m)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel("time per step (us)")
        ax.set_yscale("log")
        ax.set_title(spec["title"])
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    outdir, paths = argv[1], argv[2:]
    try:
        plots = series(load(paths))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    if not plots:
        print("plot.py: no plottable rows in " + " ".join(paths), file=sys.stderr)
        return 2
    os.makedirs(outdir, exist_ok=True)
    for name, spec in sorted(plots.items()):
        print(draw(name, spec, outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
