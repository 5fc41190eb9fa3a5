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
# GRADSYNC_SIM_JOBS (default: the cores, at most 2) runs that many
# simulations at once: each is one single-threaded SimGrid process, so two
# cores halve the wall time; OUT keeps the order of the list either way.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
np=$1
out=$2
shift 2
platforms="shared rail fast"
if [ "${1:-}" != "--" ] && [ $# -gt 0 ]; then platforms=$1; shift; fi
[ "${1:-}" = "--" ] && shift
jobs=${GRADSYNC_SIM_JOBS:-$(nproc)}
[ "$jobs" -gt 2 ] && [ -z "${GRADSYNC_SIM_JOBS:-}" ] && jobs=2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for plat in $platforms; do
  gs=""
  [ "$plat" = rail ] && gs="--group-size 8"
  for coll in "allreduce -a auto,ring,rd,rabenseifner,tree,dbtree,hier" "allgather -a auto,ring,bruck,rd,hier" \
              "reduce_scatter -a auto,ring,bruck,rd,hier" "broadcast -a auto,tree,ring,scatter_allgather,hier" \
              "reduce -a auto,tree,ring,hier"; do
    i=$((i + 1))
    echo "## $plat $np $coll" > "$tmp/$i.txt"
    printf "%s\n" "$i $plat $coll $gs $*" | sed "s/ *$//" >> "$tmp/jobs"
  done
done
# One line per job: its index, platform, then the bench arguments.
# shellcheck disable=SC2016
GRADSYNC_SIM_HERE=$here GRADSYNC_SIM_NP=$np GRADSYNC_SIM_TMP=$tmp xargs -P "$jobs" -L 1 sh -c '
  n=$1 plat=$2; shift 2
  f=$GRADSYNC_SIM_TMP/$n.txt
  start=$(date +%s)
  "$GRADSYNC_SIM_HERE/run.sh" --platform "$plat" "$GRADSYNC_SIM_NP" "$@" -c 0 --verify never 2>&1 |
    grep --line-buffered -v "^# [a-z]\|^\$\|limit\|^#  " >> "$f" || true
  echo "# wall $(( $(date +%s) - start )) s" >> "$f"
' sh < "$tmp/jobs"
: > "$out"
n=1
while [ "$n" -le "$i" ]; do cat "$tmp/$n.txt" >> "$out"; n=$((n + 1)); done
