#!/usr/bin/env python3
"""Holds gradsync's cost model to what a run measured (issue: the model tells the truth).

   bench/sim/accuracy.py [--markdown] [--plot OUT.png] RUN.txt [RUN.txt ...]

Reads gradsync-bench tables (bench/sim/run.sh output; lines "## LABEL" name
the run that follows) and prints, per run and schedule, the model's error
|model - measured| / measured at each size, marking misses: over 25 % at
>= 64 KiB, over 50 % below. Then, per (run, size), how far `auto` is from
the best forced gradsync schedule (MPI's `native` rows are shown, not
compared): a miss where it is more than 10 % slower. Exits 0;
the verdicts are the output. --markdown: one table per run instead (a row
per size, a column per schedule: measured us and the model's error; the
schedule `auto` ran in bold), then the same summary lines. --plot: also
writes OUT.png, one panel per run (title: the run's label), each schedule's
simulated time (solid, dots) and the model's prediction (dashed, same colour)
against size, log-log; `auto` and MPI's `native` rows are not drawn (auto is
one of the others; native has no model).
"""
import os
import sys

BIG = 64 * 1024


def rows(path):
    label = ""
    for line in open(path):
        if line.startswith("## "):
            label = line[3:].strip()
            continue
        f = line.split()
        if len(f) != 10 or not f[0].isdigit() or f[4] == "limit" or f[5] == "skipped":
            continue  # limit: the bench's memcpy row; skipped: not run (--skip-slower)
        try:
            t, m = float(f[5]), float(f[6])
        except ValueError:
            t, m = float(f[5]), None
        yield label, int(f[0]), f[4], t, m


def human(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def by_run_of(paths):
    """Every table row of `paths`, {label: [(size, algo, time, model)]} in file order."""
    runs = {}
    for p in paths:
        for label, size, algo, t, m in rows(p):
            runs.setdefault(label, []).append((size, algo, t, m))
    return runs


def plot_series(by_run):
    """What --plot draws: {label: {schedule: (simulated, model)}}, each a
    sorted [(bytes, us)] list (the model's only where the row has one)."""
    out = {}
    for label, rs in by_run.items():
        panel = {}
        for size, algo, t, m in rs:
            if algo.startswith("auto") or algo == "native":
                continue
            sim, model = panel.setdefault(algo, ([], []))
            sim.append((size, t))
            if m is not None:
                model.append((size, m))
        out[label] = {a: (sorted(sim), sorted(model)) for a, (sim, model) in panel.items()}
    return out


def plot(by_run, path):
    # This directory's platform.py would shadow the standard library's,
    # which matplotlib imports.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [d for d in sys.path if os.path.abspath(d or ".") != here]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot_series(by_run)
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, (label, lines) in zip(axes.flat, panels.items()):
        for i, (algo, (sim, model)) in enumerate(lines.items()):
            colour = f"C{i % 10}"
            ax.plot([b for b, _ in sim], [t for _, t in sim], "-o", color=colour, markersize=3, label=algo)
            if model:
                ax.plot([b for b, _ in model], [m for _, m in model], "--", color=colour, linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(label.split(" -a ")[0], fontsize=9)
        ax.set_xlabel("bytes", fontsize=8)
        ax.set_ylabel("us (solid: simulated, dashed: model)", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(by_run):
    for label, rs in by_run.items():
        algos = []
        for _, a, _, _ in rs:
            if not a.startswith("auto") and a not in algos:
                algos.append(a)
        print(f"\n{label}:\n")
        print("| size | auto | " + " | ".join(algos) + " |")
        print("| --- | --- |" + " --- |" * len(algos))
        for size in sorted({s for s, _, _, _ in rs}):
            cells = {a: (t, m) for s, a, t, m in rs if s == size}
            auto = next((a for a in cells if a.startswith("auto")), "")
            picked = auto.split(">", 1)[1] if ">" in auto else ""
            line = f"| {human(size)} | {picked} |"
            for a in algos:
                if a not in cells:
                    line += " |"
                    continue
                t, m = cells[a]
                err = f" ({(m - t) / t:+.0%})" if m is not None and t > 0 else ""
                cell = f"{t:.0f}{err}"
                line += f" **{cell}** |" if a == picked else f" {cell} |"
            print(line)


def main():
    args = sys.argv[1:]
    md, png = False, None
    while args and args[0] in ("--markdown", "--plot"):
        if args[0] == "--markdown":
            md, args = True, args[1:]
        elif len(args) > 1:
            png, args = args[1], args[2:]
        else:
            sys.exit(__doc__)
    if not args:
        sys.exit(__doc__)
    model_pts = model_miss = 0
    by_run = by_run_of(args)
    auto_pts = auto_ok = 0
    worst_auto = 1.0
    if md:
        markdown(by_run)
    if png:
        plot(by_run, png)
        print(f"# wrote {png}")
    for label, rs in by_run.items():
        if not md:
            print(f"## {label}")
            print(f"{'size':>10} {'algo':<24} {'sim_us':>12} {'model_us':>12} {'err':>7}")
        for size, algo, t, m in rs:
            if m is None or t <= 0:
                continue
            err = (m - t) / t
            limit = 0.25 if size >= BIG else 0.5
            miss = abs(err) > limit
            if not algo.startswith("auto"):
                model_pts += 1
                model_miss += miss
            if not md:
                print(f"{size:>10} {algo:<24} {t:>12.1f} {m:>12.1f} {err:>+7.0%}{'  MISS' if miss else ''}")
        sizes = sorted({s for s, _, _, _ in rs})
        for s in sizes:
            forced = [(t, a) for sz, a, t, _ in rs if sz == s and not a.startswith("auto") and a != "native"]
            auto = [(t, a) for sz, a, t, _ in rs if sz == s and a.startswith("auto")]
            if not forced or not auto:
                continue
            best = min(forced)
            ratio = auto[0][0] / best[0]
            auto_pts += 1
            auto_ok += ratio <= 1.10
            worst_auto = max(worst_auto, ratio)
            if ratio > 1.10:
                print(f"{'- ' if md else '  '}{label}: auto at {s}: {auto[0][1]} {auto[0][0]:.1f} us = {ratio:.2f}x best ({best[1]} {best[0]:.1f} us)")
    print(f"# model: {model_pts - model_miss}/{model_pts} points within target "
          f"(25 % at >= 64 KiB, 50 % below)")
    if auto_pts:
        print(f"# auto: {auto_ok}/{auto_pts} points within 10 % of the best forced schedule "
              f"({100.0 * auto_ok / auto_pts:.0f} %), worst {worst_auto:.2f}x")


if __name__ == "__main__":
    main()
