#!/bin/sh
# Builds gradsync-bench for SimGrid SMPI (Debian: apt-get install
# libsimgrid-dev) into BUILD/gradsync-bench-smpi (BUILD: $1, default
# build-sim): the collectives, alltoall(v) and gossip over MPI, f32 only
# (GRADSYNC_BENCH_SIM: bench/subcommands.hpp, bench/transports.hpp).
# SMPI 3.32 grants only MPI_THREAD_SINGLE and has no
# MPI_Dist_graph_create_adjacent; none of these needs either.
# GRADSYNC_MPI_BLOCKING_WAIT: a wait blocks in MPI_Wait instead of polling,
# each poll being a simulator context switch (docs/transports/mpi.md);
# GRADSYNC_MPI_SIMULATED_CLOCK: MPI_Wtime repeats itself, so calibration
# times each step once (transport/capabilities.hpp clock_repeats).
# SMPI_NO_OVERRIDE_MALLOC: SMPI's malloc macros would rewrite std::malloc in
# the standard headers; smpi_compat.h undoes its exit() macro.
# The objects compile two at a time (-O1: the sweep is one large template
# instance per collective; the simulated times do not depend on it).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-sim}
obj=$out/smpi-obj
mkdir -p "$obj"
flags="-std=c++20 -O1 -DNDEBUG -DGRADSYNC_BENCH_MPI=1 -DGRADSYNC_BENCH_SIM=1 -DGRADSYNC_MPI_BLOCKING_WAIT=1 -DGRADSYNC_MPI_SIMULATED_CLOCK=1 \
-DSMPI_NO_OVERRIDE_MALLOC=1 -DGRADSYNC_BENCH_ELEMENT=float -include $root/bench/sim/smpi_compat.h -I$root/include"
srcs="collective_sweep alltoall collective gossip common main"
for src in $srcs; do
  echo "$src"
done | GRADSYNC_SIM_FLAGS=$flags GRADSYNC_SIM_ROOT=$root GRADSYNC_SIM_OUT=$obj xargs -P "${GRADSYNC_SIM_JOBS:-2}" -I{} \
  sh -c 'smpicxx $GRADSYNC_SIM_FLAGS -c "$GRADSYNC_SIM_ROOT/bench/{}.cpp" -o "$GRADSYNC_SIM_OUT/{}.o"'
objs=""
for src in $srcs; do objs="$objs $obj/$src.o"; done
# shellcheck disable=SC2086
smpicxx $objs -o "$out/gradsync-bench-smpi"
echo "$out/gradsync-bench-smpi" >&2
