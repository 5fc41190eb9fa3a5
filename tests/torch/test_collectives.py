#!/usr/bin/env python3
"""The gradsync backend against Gloo and against values computed here, on 2
processes: all_reduce (SUM, PRODUCT, MIN, MAX, AVG), reduce, broadcast (each
root), all_gather, _all_gather_base, reduce_scatter, _reduce_scatter_base
and barrier, for every dtype gradsync reduces (float32, float64, float16,
bfloat16, int32, int64), at sizes from 1 element to 1 Mi, contiguous and
not; plus broadcast and all_gather of dtypes that only move bytes (uint8,
bool, complex64). Where Gloo has the op (1.13 lacks reduce_scatter and AVG)
the results must equal Gloo's to rounding; always they must equal the
reference each rank computes from every rank's input. Calls return before
their collective has run (the group's worker runs them in call order).
"""
import os
import time

import torch
import torch.distributed as dist

import harness


def torch_gradsync_mpi():
    """Whether this process was started by mpiexec (test_mpi.py): the backend then runs over MPI."""
    return any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
SIZES = [1, 7, 1000, 65537, 1 << 20]


def make(rank, n, dtype, op, salt):
    """Rank `rank`'s input: small integers for integer types (products stay in range), values near 1 for PRODUCT."""
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    if dtype.is_floating_point:
        x = torch.rand(n, generator=g, dtype=torch.float64) + 0.5 if op == "prod" else \
            torch.randn(n, generator=g, dtype=torch.float64)
    else:
        x = torch.randint(-3, 4, (n,), generator=g, dtype=torch.int64)
    return x.to(dtype)


def reference(inputs, op):
    """The reduction over ranks, computed in float64 (or int64) from every rank's input."""
    wide = [t.double() if t.dtype.is_floating_point else t.long() for t in inputs]
    acc = wide[0].clone()
    for t in wide[1:]:
        acc = {"sum": acc + t, "avg": acc + t, "prod": acc * t, "min": torch.minimum(acc, t),
               "max": torch.maximum(acc, t)}[op]
    if op == "avg":
        acc = acc / len(inputs) if inputs[0].dtype.is_floating_point else torch.div(acc, len(inputs), rounding_mode="trunc")
    return acc.to(inputs[0].dtype)


def close(got, want, what):
    # Rounding: one reduction step per rank in the narrow types.
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6, torch.float64: 1e-12}
    if got.dtype in tol:
        torch.testing.assert_close(got, want, rtol=tol[got.dtype], atol=tol[got.dtype], msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: {got[:8]} != {want[:8]}"


def gloo_has(fn):
    try:
        fn()
        return True
    except RuntimeError as e:
        # Gloo 1.13 lacks reduce_scatter, AVG and bfloat16 ("Invalid scalar type").
        if any(m in str(e) for m in ("does not support", "Cannot use ReduceOp", "not supported", "Invalid scalar type")):
            return False
        raise


def check_async(rank, world, gs):
    """async_op=True returns at once: rank 0's all_reduce is still pending while
    rank 1 sleeps before its call; many outstanding calls complete in order."""
    x = torch.full((1000,), float(rank + 1))
    if rank != 0:
        time.sleep(1.0)
    w = dist.all_reduce(x, group=gs, async_op=True)
    if rank == 0:
        assert not w.is_completed(), "all_reduce(async_op=True) completed before rank 1 called"
    w.wait()
    assert w.is_completed() and w.is_success()
    assert torch.equal(x, torch.full((1000,), world * (world + 1) / 2)), x[:4]
    xs = [torch.full((257 * (k + 1),), float(k * world + rank)) for k in range(20)]
    works = [dist.all_reduce(t, group=gs, async_op=True) for t in xs]
    works.append(dist.broadcast(xs[0], 1, group=gs, async_op=True))  # after the 20 sums, in order
    for w in works:
        w.wait()
    for k, t in enumerate(xs[1:], start=1):
        want = float(sum(k * world + q for q in range(world)))
        assert torch.equal(t, torch.full_like(t, want)), (k, t[:2])
    assert torch.equal(xs[0], torch.full_like(xs[0], float(sum(range(world))))), xs[0][:2]


def run(rank, world):
    gs = dist.new_group(backend="gradsync")
    want_transport = "mpi" if torch_gradsync_mpi() else "shm"
    assert gs.transport == want_transport, (gs.transport, want_transport)
    check_async(rank, world, gs)
    gloo = dist.new_group(backend="gloo")
    checked = 0
    against_gloo = set()
    for dtype in DTYPES:
        for n in SIZES:
            if n == 1 << 20 and dtype not in (torch.float32, torch.int64):
                continue
            for op, rop in OPS.items():
                if op == "avg" and not dtype.is_floating_point:
                    continue  # torch's AVG is for floats
                ins = [make(q, n, dtype, op, 1) for q in range(world)]
                want = reference(ins, op)
                x = ins[rank].clone()
                dist.all_reduce(x, rop, group=gs)
                close(x, want, f"all_reduce {op} {dtype} n={n}")
                y = ins[rank].clone()
                if gloo_has(lambda: dist.all_reduce(y, rop, group=gloo)):
                    close(x, y, f"all_reduce {op} {dtype} n={n} vs gloo")
                    against_gloo.add((op, dtype))
                checked += 1
                # reduce to the last rank: the root gets the reduction, the others keep their input.
                root = world - 1
                x = ins[rank].clone()
                dist.reduce(x, root, rop, group=gs)
                close(x, want if rank == root else ins[rank], f"reduce {op} {dtype} n={n}")
                # reduce_scatter: rank q gets block q of the reduction of every rank's blocks.
                blocks = [make(q, world * n, dtype, op, 2) for q in range(world)]
                want_rs = reference(blocks, op).view(world, n)[rank]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, list(blocks[rank].view(world, n).unbind(0)), rop, group=gs)
                close(out, want_rs, f"reduce_scatter {op} {dtype} n={n}")
                out2 = torch.empty(n, dtype=dtype)
                dist._reduce_scatter_base(out2, blocks[rank].clone(), rop, group=gs)
                close(out2, want_rs, f"_reduce_scatter_base {op} {dtype} n={n}")
                g_out = torch.empty(n, dtype=dtype)
                if gloo_has(lambda: dist.reduce_scatter(g_out, list(blocks[rank].view(world, n).unbind(0)), rop, group=gloo)):
                    close(out, g_out, f"reduce_scatter {op} {dtype} n={n} vs gloo")
            # data movement
            mine = make(rank, n, dtype, "sum", 3)
            everyone = [make(q, n, dtype, "sum", 3) for q in range(world)]
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, mine, group=gs)
            for q in range(world):
                assert torch.equal(outs[q], everyone[q]), f"all_gather {dtype} n={n} block {q}"
            flat = torch.empty(world * n, dtype=dtype)
            dist._all_gather_base(flat, mine, group=gs)
            assert torch.equal(flat, torch.cat(everyone)), f"_all_gather_base {dtype} n={n}"
            for root in range(world):
                b = mine.clone()
                dist.broadcast(b, root, group=gs)
                assert torch.equal(b, everyone[root]), f"broadcast {dtype} n={n} root {root}"
                g = mine.clone()
                if gloo_has(lambda: dist.broadcast(g, root, group=gloo)):
                    assert torch.equal(b, g), f"broadcast {dtype} n={n} root {root} vs gloo"
    # Non-contiguous tensors: a transposed view is reduced and written back in place.
    base = [make(q, 64 * 48, torch.float32, "sum", 4).view(64, 48) for q in range(world)]
    want = reference([t.t() for t in base], "sum")
    x = base[rank].clone().t()
    assert not x.is_contiguous()
    dist.all_reduce(x, group=gs)
    close(x, want, "all_reduce of a transposed view")
    # complex64: torch reduces it as pairs of float32 (a view), so SUM goes through our float path.
    z = torch.full((100,), complex(rank + 1, -rank), dtype=torch.complex64)
    dist.all_reduce(z, group=gs)
    assert torch.equal(z, torch.full((100,), complex(world * (world + 1) / 2, -world * (world - 1) / 2),
                                     dtype=torch.complex64)), z[:2]
    # Dtypes that only move bytes.
    for dtype in (torch.uint8, torch.bool, torch.complex64):
        mine = (torch.arange(10) * (rank + 3) % 7).to(dtype)
        everyone = [(torch.arange(10) * (q + 3) % 7).to(dtype) for q in range(world)]
        outs = [torch.empty(10, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, mine, group=gs)
        assert all(torch.equal(outs[q], everyone[q]) for q in range(world)), f"all_gather {dtype}"
        b = mine.clone()
        dist.broadcast(b, 1, group=gs)
        assert torch.equal(b, everyone[1]), f"broadcast {dtype}"
    dist.barrier(group=gs)
    # f32 and i64 at 5 sizes, the others at 4; 5 ops for floats, 4 for ints.
    assert checked == 5 * 5 + 3 * 4 * 5 + 4 * 4 + 5 * 4, checked
    # Gloo 1.13 reduces float32, float64, float16, int32 and int64 with SUM, PRODUCT, MIN and MAX.
    assert len(against_gloo) == 5 * 4, sorted(map(str, against_gloo))
    if rank == 0:
        print(f"{checked} all_reduce cases (each with reduce and reduce_scatter) checked, "
              f"{len(against_gloo)} (op, dtype) pairs also against Gloo", flush=True)


if __name__ == "__main__":
    harness.main(run)
