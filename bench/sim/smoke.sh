#!/bin/sh
# The simulator build's regression run (meson test sim-smpi): 16 simulated
# ranks on the shared-NIC platform (two nodes of 8), three sizes, every
# schedule of every collective, of alltoall and of alltoallv (MoE counts),
# and the compressed allreduce's int8 and top-k rows (every rank's result
# bitwise equal), every result checked (-c 1:
# private buffers, the bench exits non-zero on any wrong element).
#   bench/sim/smoke.sh BIN
set -eu
here=$(cd "$(dirname "$0")" && pwd)
GRADSYNC_SMPI_BIN=$1
export GRADSYNC_SMPI_BIN
if ! command -v smpirun > /dev/null; then
  echo "smpirun not found (apt-get install libsimgrid-dev): skipped"
  exit 77
fi
if [ ! -x "$GRADSYNC_SMPI_BIN" ]; then # SimGrid installed after the build was configured
  echo "no simulator build ($GRADSYNC_SMPI_BIN; reconfigure with SimGrid installed): skipped"
  exit 77
fi
sizes="-b 8 -e 1M -f 128 -n 2 -w 1 -c 1"
run() {
  echo "+ run.sh 16 $*"
  "$here/run.sh" 16 "$@" $sizes > "${TMPDIR:-/tmp}/gradsync-sim-smoke.$$" 2>&1 || {
    cat "${TMPDIR:-/tmp}/gradsync-sim-smoke.$$"
    rm -f "${TMPDIR:-/tmp}/gradsync-sim-smoke.$$"
    exit 1
  }
  grep -E '^ +[0-9]' "${TMPDIR:-/tmp}/gradsync-sim-smoke.$$" | awk '{print "  " $1, $5, $6, $NF}'
}
trap 'rm -f "${TMPDIR:-/tmp}/gradsync-sim-smoke.$$"' EXIT
run allreduce -a auto,ring,tree,dbtree,rd,rabenseifner,hier,2d,native
run allreduce -a auto -z int8 -z topk:density=0.01 # compressed: ranks agree bitwise (sparse: the payload ring)
run reduce_scatter -a auto,ring,bruck,rd,hier,native
run allgather -a auto,ring,bruck,rd,hier,native
run broadcast -a auto,ring,tree,scatter_allgather,hier,native
run reduce -a auto,ring,tree,hier,native
run alltoall -a auto,pairwise,scattered,bruck,hier,native
run alltoallv -a auto,pairwise,scattered,hier,native --pattern moe
