"""Runs a test function in N processes joined by torch.distributed (the
default group is Gloo; tests make their gradsync groups with new_group or
init their own). Used by the tests in this directory, run by meson with the
system interpreter and PYTHONPATH naming the built torch_gradsync.

A test script calls main(fn): exit 0 when every rank's fn returned, 1 when
any raised or exited non-zero (its traceback printed), 1 on a hang (after
`timeout` seconds, every rank killed), 77 (skip) only when torch does not
import at all."""
import multiprocessing as mp
import os
import sys
import tempfile
import traceback

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - CI installs python3-torch
    print(f"skip: torch does not import in {sys.executable}: {e}")
    sys.exit(77)


def _child(fn, rank, world, store_file, backend, args):
    import warnings
    warnings.filterwarnings("ignore", message=".*private function and will be deprecated")
    try:
        import torch_gradsync  # noqa: F401  (registers the backend)
        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"file://{store_file}", rank=rank, world_size=world)
        fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def spawn(fn, world=2, backend="gloo", timeout=240, args=()):
    """Runs fn(rank, world, *args) on `world` processes; returns their exit codes (None: hung, killed)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gradsync-torch-") as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=_child, args=(fn, r, world, store, backend, args)) for r in range(world)]
        for p in procs:
            p.start()
        codes = []
        for p in procs:
            p.join(timeout)
            codes.append(p.exitcode)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        return codes


def main(fn, world=2, backend="gloo", timeout=240, args=()):
    codes = spawn(fn, world, backend, timeout, args)
    if any(c != 0 for c in codes):
        print(f"FAIL: exit codes per rank {codes} (None: still running after {timeout} s, killed)")
        sys.exit(1)
    print("ok")
    sys.exit(0)
