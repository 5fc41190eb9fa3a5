#!/usr/bin/env python3
"""gradsync in PyTorch: 2 processes on this machine, side by side.

1. torch.distributed.all_reduce of float32 tensors (1 KiB .. 64 MiB) through
   the Gloo backend and through the gradsync backend: time and busbw.
2. The same small MLP trained with DDP three ways from the same seed and
   data: Gloo backend, gradsync backend, gradsync backend with gradsync's
   compressed comm hook (--codec, default int8): the loss curves and the
   median step times, beside the same model trained without DDP (no
   gradient exchange: the compute time alone).

Exits 1 if the gradsync backend's losses differ from Gloo's by more than
rounding (1e-4 relative), or the compressed run's final loss is not within
10% of Gloo's. Run with the interpreter that has torch (Debian:
/usr/bin/python3) and torch_gradsync on the path:

  PYTHONPATH=build/torch_gradsync /usr/bin/python3 examples/pytorch/train.py
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def allreduce_bench(rank, groups, sizes, budget_s):
    """{backend: [(bytes, us, busbw GB/s)]}; time is the slowest rank's mean per call."""
    out = {name: [] for name in groups}
    for b in sizes:
        n = b // 4
        for name, g in groups.items():
            x = torch.ones(n)
            for _ in range(3):
                dist.all_reduce(x, group=g)
            # As many calls as fit in the budget on the warm-up's speed (same on every rank).
            t0 = time.perf_counter()
            dist.all_reduce(x, group=g)
            one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(one, dist.ReduceOp.MAX)
            iters = max(3, min(1000, int(budget_s / max(one.item(), 1e-6))))
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x, group=g)
            el = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
            dist.all_reduce(el, dist.ReduceOp.MAX)
            sec = el.item()
            p = dist.get_world_size()
            out[name].append((b, sec * 1e6, 2 * (p - 1) / p * b / sec / 1e9))
    return out


def data(rank, step, batch):
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(batch, 64, generator=g)
    w = torch.linspace(-1, 1, 64 * 8).view(64, 8)
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(batch, 8, generator=g)


def train(rank, configs, steps, hidden):
    """{name: (losses, step times)} for DDP runs configured {name: (group, codec or None)}.

    The runs train side by side, one step of each in turn, in an order that
    rotates every step: the machine's drift (other load, clocks) then falls on
    all of them alike, where runs one after another differed by +-10 ms here.
    """
    import torch_gradsync
    runs = {}
    for name, (group, codec) in configs.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                    torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                    torch.nn.Linear(hidden, 8))
        # group None: the model alone, no gradient exchange (compute time alone)
        ddp = model if group is None else torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        if codec is not None:
            torch_gradsync.register_comm_hook(ddp.reducer, group, codec)
        runs[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9))
    out = {name: ([], []) for name in configs}
    names = list(configs)
    for step in range(steps):
        x, y = data(rank, step, 128)
        k = step % len(names)
        for name in names[k:] + names[:k]:
            ddp, opt = runs[name]
            losses, times = out[name]
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            l = loss.detach().clone()
            dist.all_reduce(l)
            losses.append(l.item() / dist.get_world_size())
    return out


def worker(rank, world, store, args, failed):
    import torch_gradsync  # noqa: F401  (registers the "gradsync" backend)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    gs = dist.new_group(backend="gradsync")
    gloo = dist.new_group(backend="gloo")
    lead = rank == 0
    if args.sizes:
        sizes = [1 << k for k in range(10, 27, 2) if (1 << k) <= args.max_bytes]
        res = allreduce_bench(rank, {"gloo": gloo, "gradsync": gs}, sizes, args.budget)
        if lead:
            print(f"all_reduce float32, {world} processes, gradsync over {gs.transport}")
            print(f"{'bytes':>10} {'gloo us':>10} {'gloo busbw':>11} {'gradsync us':>12} {'gs busbw':>9} {'x':>6}")
            for (b, gt, gb), (_, st, sb) in zip(res["gloo"], res["gradsync"]):
                print(f"{b:>10} {gt:>10.1f} {gb:>11.3f} {st:>12.1f} {sb:>9.3f} {sb / gb:>6.2f}")
            print()
    runs = train(rank, {"gloo": (gloo, None), "gradsync": (gs, None), f"gradsync+{args.codec}": (gs, args.codec),
                        "compute alone": (None, None)}, args.steps, args.hidden)
    if lead:
        names = list(runs)
        print(f"DDP, MLP 64-{args.hidden}x3-8, {world} processes: loss per step")
        print(f"{'step':>5} " + " ".join(f"{n:>18}" for n in names))
        every = max(1, args.steps // 20)
        for s in list(range(0, args.steps, every)) + ([args.steps - 1] if (args.steps - 1) % every else []):
            print(f"{s:>5} " + " ".join(f"{runs[n][0][s]:>18.6f}" for n in names))
        print("median step time (ms): " + ", ".join(
            f"{n} {1e3 * statistics.median(runs[n][1][2:]):.3f}" for n in names))
        g = runs["gloo"][0]
        ok = all(abs(a - b) <= 1e-4 * abs(b) + 1e-7 for a, b in zip(runs["gradsync"][0], g))
        comp = runs[f"gradsync+{args.codec}"][0][-1]
        if not ok:
            print("FAIL: the gradsync backend's losses differ from Gloo's")
            failed.value = 1
        if abs(comp - g[-1]) > 0.10 * g[-1]:
            print(f"FAIL: {args.codec}'s final loss {comp:.6f} is not within 10% of Gloo's {g[-1]:.6f}")
            failed.value = 1
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512, help="MLP width")
    ap.add_argument("--codec", default="int8", help="the hook's codec: int8, topk:0.01, powersgd:rank=4, automatic ...")
    ap.add_argument("--no-sizes", dest="sizes", action="store_false", help="skip the all_reduce table")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per all_reduce size and backend")
    args = ap.parse_args()
    world = 2
    ctx = mp.get_context("spawn")
    failed = ctx.Value("i", 0)
    with tempfile.TemporaryDirectory(prefix="gradsync-train-") as d:
        procs = [ctx.Process(target=worker, args=(r, world, os.path.join(d, "store"), args, failed))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    codes = [p.exitcode for p in procs]
    if any(codes):
        print(f"train.py: worker exit codes {codes}", file=sys.stderr)
        return 1
    return failed.value


if __name__ == "__main__":
    sys.exit(main())
