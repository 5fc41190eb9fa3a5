#!/bin/sh
# Runs the SMPI build of gradsync-bench gossip on the two-level platform
# (cluster.xml: nodes of 8 ranks, 10 Gbit/s between nodes):
#   bench/sim/run.sh NP [gossip options...]
# e.g. bench/sim/run.sh 64 -g one_peer -b 1M -e 4M -f 4 -n 3 -w 1
# Computation is not simulated (smpi/simulate-computation:no): the times are
# the network's alone, the same on any host running the simulation.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${GRADSYNC_SMPI_BIN:-$here/../../build-sim/gradsync-bench-smpi}
np=$1
shift
hosts=$(mktemp)
trap 'rm -f "$hosts"' EXIT
n=0
while [ "$n" -lt "$np" ]; do
  echo "node-$((n / 8))" >> "$hosts"
  n=$((n + 1))
done
exec smpirun -np "$np" -platform "$here/cluster.xml" -hostfile "$hosts" \
  --cfg=smpi/simulate-computation:no --cfg=smpi/test:1e-7 --cfg=smpi/display-timing:yes --log=root.thres:warning \
  "$bin" gossip -t mpi "$@"
