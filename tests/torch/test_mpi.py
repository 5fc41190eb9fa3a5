#!/usr/bin/env python3
"""test_collectives.py's checks with the gradsync backend over MPI: run under
`mpiexec -n 2`, each MPI process is one torch rank (rank and size from the
launcher), the default group is Gloo over a TCPStore on localhost, and the
gradsync group must report transport "mpi"."""
import os
import sys
import traceback
import warnings

try:
    import torch.distributed as dist
except ImportError as e:
    print(f"skip: torch does not import in {sys.executable}: {e}")
    sys.exit(77)

import test_collectives

warnings.filterwarnings("ignore", message=".*private function and will be deprecated")
rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
# Both ranks share their launcher's proxy as parent: a port the two agree on.
port = 20000 + os.getppid() % 20000
try:
    import torch_gradsync  # noqa: F401
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    test_collectives.run(rank, world)
    dist.barrier()
    dist.destroy_process_group()
except BaseException:
    traceback.print_exc()
    sys.stdout.flush()
    os._exit(1)
print(f"rank {rank}: ok", flush=True)
