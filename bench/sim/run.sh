#!/bin/sh
# Runs the SMPI build of gradsync-bench on a simulated two-level cluster:
#   bench/sim/run.sh [--platform shared|fast|rail] [--rail] NP [SUBCOMMAND] [options...]
# e.g. bench/sim/run.sh 256 allreduce -a auto,ring,rabenseifner -b 8 -e 64M -f 8 -c 0
#      bench/sim/run.sh --platform rail 64 gossip -g one_peer -b 1M -e 4M
# SUBCOMMAND defaults to gossip (the first simulated one). Platforms
# (platform.py): `shared` (default) nodes of 8 ranks sharing one 10 Gbit/s
# NIC; `fast` the same with 100 Gbit/s NICs; `rail` one 10 Gbit/s NIC per
# rank (--rail is short for it).
# Payloads: with -c 0 the bench allocates them as SMPI shared memory
# (smpi/shared-malloc:global maps every rank's buffers onto the same pages,
# and SMPI then skips copying their bytes), so 1024 ranks x 64 MiB fit in
# memory; -c 1 runs (private buffers, every result checked) stay small.
# The shared block is 256 MiB, mapped once per buffer: with SMPI's 1 MiB
# default, 1024 ranks' 64 MiB buffers needed more mappings than Linux
# allows (vm.max_map_count 65530: "Could not map folded virtual memory").
# SimGrid keeps that block in a file in /tmp; at 1024 ranks with large
# payloads (alltoall at 256 KiB per peer maps it about 6 times a rank) the
# kernel's periodic writeback of its dirty pages walks each page's ~6000
# mappings, and the simulator sat in D state behind a kworker for minutes.
# Each start also writes the binary's 1024 private copies (~5 GB), which
# passes the background writeback threshold. As root, for the runs,
# `sysctl -w vm.dirty_writeback_centisecs=0 vm.dirty_background_ratio=50
# vm.dirty_ratio=70` kept it running (Debian's defaults, to restore after:
# 500, 10, 20).
# smpi/allgather:bruck: SMPI's default MPI_Allgather posts p-1 sends and
# receives per rank at once and finishing them is quadratic in SimGrid 3.32
# (a list scan per completion): the one-int allgather of the communicator's
# node map took over 14 CPU-minutes at 256 ranks. The ring then took 31 s of
# a 1024-rank run (1023 steps, every flow re-solved at each); Bruck's log2 p
# steps take 2.5 s. Only that untimed setup call uses MPI_Allgather here.
# Computation is not simulated (smpi/simulate-computation:no): the times are
# the network's alone, the same on any host running the simulation.
# GRADSYNC_SIM_CFG: more smpirun options, e.g. "--cfg=smpi/lat-factor:0:1
# --cfg=smpi/bw-factor:0:1" to turn off SMPI's size-dependent latency and
# bandwidth factors (docs/benchmarks.md: what they do to the model's error).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${GRADSYNC_SMPI_BIN:-$here/../../build-sim/gradsync-bench-smpi}
kind=shared
while :; do
  case "${1:-}" in
  --rail) kind=rail; shift ;;
  --platform) kind=$2; shift 2 ;;
  *) break ;;
  esac
done
np=$1
shift
sub=gossip
case "${1:-}" in
"" | -*) ;;
*) sub=$1; shift ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/platform.py" "$kind" "$np" "$tmp/platform.xml" "$tmp/hosts"
# Not exec: the trap removes the generated platform afterwards.
smpirun -np "$np" -platform "$tmp/platform.xml" -hostfile "$tmp/hosts" \
  --cfg=smpi/simulate-computation:no --cfg=smpi/test:1e-7 --cfg=smpi/allgather:bruck \
  --cfg=smpi/shared-malloc:global --cfg=smpi/shared-malloc-blocksize:268435456 --cfg=smpi/display-timing:yes --log=root.thres:warning ${GRADSYNC_SIM_CFG:-} \
  "$bin" "$sub" -t mpi "$@"
