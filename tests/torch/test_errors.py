#!/usr/bin/env python3
"""Bad input to the gradsync backend raises RuntimeError naming the op and
the rank, never crashes or hangs: unsupported dtypes and reduce ops, wrong
output and input lists, mismatched dtypes, a root out of range, a bad codec
for the DDP hook. After each locally detected error the group still works
(an all_reduce that must give the right sum). Last, the ranks pass tensors of
different sizes to one all_reduce: every rank must raise (the harness fails
a hang after its timeout)."""
import torch
import torch.distributed as dist

import harness
import torch_gradsync


def raises(fn, *needles):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"message {msg!r} lacks {n!r}"
        return msg
    raise AssertionError(f"no RuntimeError (wanted one mentioning {needles})")


def still_works(gs, rank, world):
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x, group=gs)
    assert torch.equal(x, torch.full((1000,), world * (world + 1) / 2)), x[:4]


def run(rank, world):
    gs = dist.new_group(backend="gradsync")
    r = f"rank {rank}"
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint8), group=gs), "allreduce", r, "Byte")
    still_works(gs, rank, world)
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), dist.ReduceOp.BAND, group=gs),
           "allreduce", r, "reduce op")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16), group=gs), "allreduce", r, "Short")
    still_works(gs, rank, world)
    # Called on the group itself (torch.distributed's wrappers check some of these first).
    raises(lambda: gs.allgather([[torch.empty(4)] * (world + 1)], [torch.ones(4)]),
           "allgather", r, f"{world + 1} tensors")
    raises(lambda: gs.allgather([[torch.empty(5) for _ in range(world)]], [torch.ones(4)]),
           "allgather", r, "5 elements")
    raises(lambda: gs.allgather([[torch.empty(4, dtype=torch.float64) for _ in range(world)]], [torch.ones(4)]),
           "allgather", r, "dtype")
    raises(lambda: gs._allgather_base(torch.empty(4 * world + 1), torch.ones(4)), "_allgather_base", r)
    raises(lambda: gs.reduce_scatter([torch.empty(4)], [[torch.ones(3)] * world]), "reduce_scatter", r, "3 elements")
    raises(lambda: gs.reduce_scatter([torch.empty(4)], [[torch.ones(4)] * (world + 1)]), "reduce_scatter", r)
    raises(lambda: gs._reduce_scatter_base(torch.empty(4), torch.ones(4 * world + 2)), "_reduce_scatter_base", r)
    raises(lambda: gs.allreduce([torch.ones(4), torch.ones(4)]), "allreduce", r, "one tensor")
    opts = dist.BroadcastOptions()
    opts.rootRank = world
    raises(lambda: gs.broadcast([torch.ones(4)], opts), "broadcast", r, "root")
    raises(lambda: gs.broadcast([torch.ones(4), torch.ones(4)]), "broadcast", r, "one tensor")
    raises(lambda: dist.all_reduce(torch.ones(3, 3).to_sparse(), group=gs), "sparse")
    still_works(gs, rank, world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), process_group=gs)
    raises(lambda: torch_gradsync.register_comm_hook(model.reducer, gs, "nosuchcodec"), "comm_hook", r, "nosuchcodec")
    raises(lambda: torch_gradsync.register_comm_hook(model.reducer, gs, "topk:density=2"), "comm_hook", r, "density")
    still_works(gs, rank, world)
    # Ranks disagree: 1000 elements on rank 0, 1200 on rank 1.
    m1 = raises(lambda: dist.all_reduce(torch.ones(1000 + 200 * rank), group=gs), "gradsync")
    # Same with a large tensor (another schedule).
    gs2 = dist.new_group(backend="gradsync")
    m2 = raises(lambda: dist.all_reduce(torch.ones((1 << 20) + 4096 * rank), group=gs2), "gradsync")
    print(f"rank {rank} mismatched sizes: {m1.splitlines()[0]} | {m2.splitlines()[0]}", flush=True)


if __name__ == "__main__":
    harness.main(run, timeout=180)
