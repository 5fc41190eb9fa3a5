#!/usr/bin/env bash
# The bench suite: every collective on the in-process default transport (no
# launcher needed), then, when MPI is present, gradsync vs MPI's own
# collectives under `mpiexec -n 2` (mpi and shm transports), then the codecs.
# Usage: bench/suite.sh [BUILD_DIR]   (tables on stdout; JSON lines in BUILD_DIR/bench-results)
set -euo pipefail
build=${1:-build-bench}
bench="$build/bench/gradsync-bench"
[ -x "$bench" ] || { echo "bench/suite.sh: $bench not built (ninja -C $build)" >&2; exit 2; }
out="$build/bench-results"
mkdir -p "$out"
run() { echo; echo "\$ $*"; "$@"; }

for c in allreduce reduce_scatter allgather broadcast; do
  run "$bench" "$c" -t inproc --ranks 4 -a auto -b 8 -e 64M -f 4 -c 1 --json "$out/inproc-$c.json"
done
run "$bench" allreduce -t inproc --ranks 8 -a ring,tree,rd,rabenseifner,auto -b 8 -e 16M -f 16 -c 1 \
  --json "$out/inproc8-allreduce.json"

if command -v mpiexec >/dev/null && "$bench" allreduce --help 2>/dev/null | grep -q mpi; then
  run mpiexec -n 2 "$bench" allreduce -t mpi -a ring,auto,native -b 8 -e 64M -f 4 -c 1 --json "$out/mpi-allreduce.json"
  run mpiexec -n 2 "$bench" allreduce -t shm -a auto,ring -b 8 -e 64M -f 4 -c 1 --json "$out/shm-allreduce.json"
  for c in reduce_scatter allgather broadcast; do
    run mpiexec -n 2 "$bench" "$c" -t mpi -a auto,native -b 8 -e 64M -f 16 -c 1 --json "$out/mpi-$c.json"
  done
fi

run "$bench" compress -z fp16 -z bf16 -z int8 -z int4 -z sign -z qsgd -z terngrad \
  -z topk:density=0.01 -z approx_topk:density=0.01 -z randk:density=0.01 -b 1M -e 64M -f 8 \
  --json "$out/compress.json"
echo; echo "JSON results in $out"
