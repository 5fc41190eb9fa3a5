#!/bin/sh
# Runs the SMPI build of gradsync-bench gossip on a two-level platform:
#   bench/sim/run.sh [--rail] NP [gossip options...]
# e.g. bench/sim/run.sh 64 -g one_peer -b 1M -e 4M -f 4 -n 3 -w 1
# Default platform: cluster.xml (nodes of 8 ranks sharing one 10 Gbit/s NIC).
# --rail: rail.py's platform (the same links, but one NIC per rank, as GPU
# clusters are built).
# smpi/allgather:ring: SMPI's default MPI_Allgather posts p-1 sends and
# receives per rank at once and finishing them is quadratic in SimGrid 3.32
# (a list scan per completion): the one-int allgather of the communicator's
# node map took over 14 CPU-minutes at 256 ranks; the ring takes seconds. Only
# that untimed setup call uses MPI_Allgather here.
# Computation is not simulated (smpi/simulate-computation:no): the times are
# the network's alone, the same on any host running the simulation.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${GRADSYNC_SMPI_BIN:-$here/../../build-sim/gradsync-bench-smpi}
rail=0
if [ "${1:-}" = --rail ]; then rail=1; shift; fi
np=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$rail" = 1 ]; then
  platform=$tmp/rail.xml
  python3 "$here/rail.py" "$np" "$platform" "$tmp/hosts"
else
  platform=$here/cluster.xml
  n=0
  while [ "$n" -lt "$np" ]; do
    echo "node-$((n / 8))" >> "$tmp/hosts"
    n=$((n + 1))
  done
fi
# Not exec: the trap removes the generated platform afterwards.
smpirun -np "$np" -platform "$platform" -hostfile "$tmp/hosts" \
  --cfg=smpi/simulate-computation:no --cfg=smpi/test:1e-7 --cfg=smpi/allgather:ring --cfg=smpi/display-timing:yes --log=root.thres:warning \
  "$bin" gossip -t mpi "$@"
