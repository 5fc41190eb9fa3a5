#!/usr/bin/env python3
"""Holds gradsync's cost model to what a run measured (issue: the model tells the truth).

   bench/sim/accuracy.py [--markdown] RUN.txt [RUN.txt ...]

Reads gradsync-bench tables (bench/sim/run.sh output; lines "## LABEL" name
the run that follows) and prints, per run and schedule, the model's error
|model - measured| / measured at each size, marking misses: over 25 % at
>= 64 KiB, over 50 % below. Then, per (run, size), how far `auto` is from
the best forced gradsync schedule (MPI's `native` rows are shown, not
compared): a miss where it is more than 10 % slower. Exits 0;
the verdicts are the output. --markdown: one table per run instead (a row
per size, a column per schedule: measured us and the model's error; the
schedule `auto` ran in bold), then the same summary lines.
"""
import sys

BIG = 64 * 1024


def rows(path):
    label = ""
    for line in open(path):
        if line.startswith("## "):
            label = line[3:].strip()
            continue
        f = line.split()
        if len(f) != 10 or not f[0].isdigit():
            continue
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
    md = bool(args) and args[0] == "--markdown"
    if md:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    data = [r for p in args for r in rows(p)]
    model_pts = model_miss = 0
    by_run = {}
    for label, size, algo, t, m in data:
        by_run.setdefault(label, []).append((size, algo, t, m))
    auto_pts = auto_ok = 0
    worst_auto = 1.0
    if md:
        markdown(by_run)
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
