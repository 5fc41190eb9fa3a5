#!/bin/sh
# Builds gradsync-bench's gossip subcommand with SimGrid's smpicxx (Debian:
# apt-get install libsimgrid-dev) into build-sim/gradsync-bench-smpi.
# SMPI 3.32 grants only MPI_THREAD_SINGLE and has no MPI_Dist_graph_create_adjacent;
# gossip needs neither (plain point-to-point).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-sim}
mkdir -p "$out"
# SMPI_NO_OVERRIDE_MALLOC: SMPI's malloc macros would rewrite std::malloc in
# the standard headers; smpi_compat.h undoes its exit() macro.
smpicxx -std=c++20 -O2 -DNDEBUG -DGRADSYNC_BENCH_MPI=1 -DGRADSYNC_BENCH_GOSSIP_ONLY=1 -DGRADSYNC_BENCH_SIM=1 -DGRADSYNC_MPI_BLOCKING_WAIT=1 \
  -DSMPI_NO_OVERRIDE_MALLOC=1 -include "$root/bench/sim/smpi_compat.h" -I"$root/include" "$root/bench/main.cpp" "$root/bench/common.cpp" "$root/bench/gossip.cpp" \
  -o "$out/gradsync-bench-smpi"
echo "$out/gradsync-bench-smpi"
