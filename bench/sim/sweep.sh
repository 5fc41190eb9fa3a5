#!/bin/sh
# The model-vs-simulation sweep of docs/benchmarks.md ("Every collective at
# scale"): every schedule of allreduce, allgather, reduce_scatter,
# broadcast and reduce on NP simulated ranks, on each platform, into OUT (one "## ..."
# line per run), for bench/sim/accuracy.py.
#   bench/sim/sweep.sh NP OUT [PLATFORMS] -- [bench options]
# e.g. bench/sim/sweep.sh 64 sim64.txt "shared rail fast" -- -b 8 -e 16M -f 16 -n 2 -w 1
# At 1024 ranks add --skip-slower F (gradsync-bench): forced schedules the
# model puts above F times the size's best are not simulated (minutes of host
# time each for rd or a segmented tree at 8 MiB), their rows say "skipped".
# Rows are unchecked (-c 0: shared-memory payloads, no element work) and
# without the agreement check (--verify never), which no formula includes.
# rail gets --group-size 8 (its ranks are one SimGrid host each, so MPI sees
# no nodes).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
np=$1
out=$2
shift 2
platforms="shared rail fast"
if [ "${1:-}" != "--" ] && [ $# -gt 0 ]; then platforms=$1; shift; fi
[ "${1:-}" = "--" ] && shift
: > "$out"
for plat in $platforms; do
  gs=""
  [ "$plat" = rail ] && gs="--group-size 8"
  for coll in "allreduce -a auto,ring,rd,rabenseifner,tree,dbtree,hier" "allgather -a auto,ring,bruck,rd,hier" \
              "reduce_scatter -a auto,ring,bruck,rd,hier" "broadcast -a auto,tree,ring,scatter_allgather,hier" \
              "reduce -a auto,tree,ring,hier"; do
    echo "## $plat $np $coll" >> "$out"
    start=$(date +%s)
    # shellcheck disable=SC2086
    "$here/run.sh" --platform "$plat" "$np" $coll $gs "$@" -c 0 --verify never 2>&1 |
      grep -v '^# [a-z]\|^$\|limit\|^#  ' >> "$out" || true
    echo "# wall $(( $(date +%s) - start )) s" >> "$out"
  done
done
