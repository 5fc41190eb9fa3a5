#!/usr/bin/env bash
# The bench suite: every collective on the in-process default transport (no
# launcher needed); every allreduce algorithm beside the calibrated model's
# prediction and -a auto (8 in-process ranks, and, when MPI is present,
# `mpiexec -n 2` over the mpi and shm transports with MPI's own collective);
# over shm also on shared buffers (alloc_shared); gradsync vs MPI's other
# collectives; compressed allreduce (shm, and over a 1 Gbit/s link between
# network namespaces when run as root: bench/netrig.sh); tensor fusion; the
# codecs; a cliff sweep over shm (bench/cliff_check.py: busbw drops > 30 %
# between sizes or runs, 1-256 MiB, flagged points rerun standalone); last,
# bench/auto_check.py's tables (per size, auto against the best fixed
# algorithm) and bench/versus.py's (ring and shm against MPI's own allreduce,
# busbw against the memcpy limit); bench/plot.py's PNGs of all of it.
# Usage: bench/suite.sh [BUILD_DIR]   (tables on stdout; JSON lines in BUILD_DIR/bench-results,
# plots in BUILD_DIR/bench-results/plots)
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
# 8 threads on few cores: large sizes with 10 iterations each, or this run alone would take minutes.
inproc8=(allreduce -t inproc --ranks 8 --group-size 4 -a ring,tree,dbtree,rd,rabenseifner,hier,2d,auto -c 1)
run "$bench" "${inproc8[@]}" -b 8 -e 256K -f 8 --json "$out/inproc8-allreduce-small.json"
run "$bench" "${inproc8[@]}" -b 1M -e 16M -f 4 -n 10 -w 2 --json "$out/inproc8-allreduce-large.json"
checked=("$out"/inproc8-allreduce-small.json "$out"/inproc8-allreduce-large.json)
versus=()
cliff=()
cliff_rerun=()

if command -v mpiexec >/dev/null && "$bench" allreduce --help 2>/dev/null | grep -q mpi; then
  every=ring,tree,dbtree,rd,rabenseifner,auto
  run mpiexec -n 2 "$bench" allreduce -t mpi -a "$every,native" -b 8 -e 64M -f 4 -c 1 --json "$out/mpi-allreduce.json"
  run mpiexec -n 2 "$bench" allreduce -t shm -a "direct,$every" -b 8 -e 64M -f 4 -c 1 --json "$out/shm-allreduce.json"
  # Buffers from alloc_shared: shm_direct reads and writes them in place.
  run mpiexec -n 2 "$bench" allreduce -t shm -a direct,auto --shared-buffers -b 8 -e 64M -f 4 -c 1 \
    --json "$out/shm-shared-allreduce.json"
  checked+=("$out"/mpi-allreduce.json "$out"/shm-allreduce.json)
  versus+=("mpi:ring mpi:native $out/mpi-allreduce.json"
           "shm:auto mpi:native $out/shm-allreduce.json $out/mpi-allreduce.json"
           "shm:direct:shared mpi:native shared=$out/shm-shared-allreduce.json $out/mpi-allreduce.json")
  # What the call check costs a small allreduce over MPI (issue 27; docs/reliability.md).
  run mpiexec -n 2 "$bench" check-cost -t mpi -b 8,4K
  for c in reduce_scatter allgather broadcast; do
    run mpiexec -n 2 "$bench" "$c" -t mpi -a auto,native -b 8 -e 64M -f 16 -c 1 --json "$out/mpi-$c.json"
  done
  # Exchange (issue 29): alltoall and alltoallv (MoE-like counts, learned
  # counts beside known ones) over shm and MPI, MPI_Alltoall(v) in the same run.
  for t in shm mpi; do
    run mpiexec -n 2 "$bench" alltoall -t "$t" -a "auto,pairwise,scattered,bruck$([ "$t" = mpi ] && echo ,native || echo ,direct)" \
      -b 8 -e 16M -f 4 -c 1 --json "$out/$t-alltoall.json"
    run mpiexec -n 2 "$bench" alltoallv -t "$t" --pattern skewed --dynamic --plan \
      -a "auto$([ "$t" = mpi ] && echo ,native)" -b 8 -e 16M -f 4 -c 1 --json "$out/$t-alltoallv.json"
  done
  checked+=("$out"/shm-alltoall.json "$out"/mpi-alltoall.json "$out"/shm-alltoallv.json "$out"/mpi-alltoallv.json)
  # Cliff sweep (issue 32): every collective and schedule over shm, 1 MiB to
  # 256 MiB, twice; bench/cliff_check.py below prints any size where busbw
  # drops > 30 % from the size before, or between the two runs, judged against
  # a memcpy of that size measured just before its rows (--memcpy-each-size).
  # Iterations automatic (200 calls at 1 MiB down to 5 from 205 MiB, about
  # 1 GiB per row): with 5 calls per row a single preemption at 1-32 MiB
  # showed as a run-to-run cliff.
  rm -f "$out"/shm-cliff-*.json
  for run_no in 1 2; do
    for spec in "allreduce direct,ring,tree,dbtree,rd,rabenseifner" "reduce_scatter direct,ring" \
                "allgather direct,ring" "broadcast direct,ring,tree" "reduce direct,ring,tree"; do
      set -- $spec
      run mpiexec -n 2 "$bench" "$1" -t shm -a "$2" -b 1M -e 256M -c 0 --memcpy-each-size \
        --json "$out/shm-cliff-$1-$run_no.json"
      cliff+=("$out/shm-cliff-$1-$run_no.json")
    done
  done
  # Each flagged point measured again standalone (one launch per size, as a
  # user runs it), three times: cliff_check.py --rerun keeps a cliff only if
  # the best rerun reproduces it, and lists the rest as transient.
  if command -v python3 >/dev/null; then
    run python3 "$(dirname "$0")/cliff_check.py" --points "$out/shm-cliff-points.txt" "${cliff[@]}"
    k=0
    while read -r -u 3 np coll transport algo bytes; do  # fd 3: mpiexec reads stdin
      for _ in 1 2 3; do
        k=$((k + 1))
        run mpiexec -n "$np" "$bench" "$coll" -t "$transport" -a "$algo" -b "$bytes" -e "$bytes" -c 0 \
          --memcpy-each-size --json "$out/shm-cliff-rerun-$k.json"
        cliff_rerun+=("$out/shm-cliff-rerun-$k.json")
      done
    done 3< "$out/shm-cliff-points.txt"
  fi
fi

# Compressed allreduce beside the dense one, and where `automatic` decides:
# over shared memory (where compression does not pay) ...
zs=(-z int8 -z topk:density=0.01 -z approx_topk:density=0.01)
if command -v mpiexec >/dev/null && "$bench" allreduce --help 2>/dev/null | grep -q mpi; then
  run mpiexec -n 2 "$bench" allreduce -t shm -o avg -a auto "${zs[@]}" -b 1M -e 64M -f 8 -n 5 -w 1 \
    --json "$out/shm-compressed.json"
  # ... and across a 1 Gbit/s link between two network namespaces (root only):
  # one 1-64 MiB sweep with dense (gradsync auto, MPI native) and every codec,
  # always and automatic, over the same link (plot.py: compressed-mpi-rig-n2.png).
  if [ "$(id -u)" = 0 ] && "$(dirname "$0")/netrig.sh" --check >/dev/null 2>&1; then
    run "$(dirname "$0")/netrig.sh" -- "$bench" allreduce -t mpi -o avg -a auto,native "${zs[@]}" \
      -b 1M -e 64M -f 2 -n 3 -w 1 --json "$out/rig-compressed.json"
  else
    echo; echo "# netrig: skipped (needs root, ip netns and tc)"
  fi
else
  run "$bench" allreduce -t inproc --ranks 2 -o avg -a auto "${zs[@]}" -b 1M -e 64M -f 8 -n 5 -w 1 \
    --json "$out/inproc-compressed.json"
fi
# Tensor fusion: 1024 x 4 KiB and ResNet-50's gradients, fused against one call each.
run "$bench" fusion -t inproc --ranks 2 --json "$out/inproc-fusion.json"
if command -v mpiexec >/dev/null && "$bench" allreduce --help 2>/dev/null | grep -q mpi; then
  run mpiexec -n 2 "$bench" fusion -t shm --json "$out/shm-fusion.json"
  run mpiexec -n 2 "$bench" fusion -t mpi --json "$out/mpi-fusion.json"
fi

run "$bench" compress -z fp16 -z bf16 -z int8 -z int4 -z sign -z qsgd -z terngrad \
  -z topk:density=0.01 -z approx_topk:density=0.01 -z randk:density=0.01 -b 1M -e 64M -f 8 \
  --json "$out/compress.json"

if command -v python3 >/dev/null; then
  run python3 "$(dirname "$0")/auto_check.py" "${checked[@]}"
  if [ "${#cliff[@]}" -gt 0 ]; then
    if [ "${#cliff_rerun[@]}" -gt 0 ]; then cliff+=(--rerun "${cliff_rerun[@]}"); fi
    run python3 "$(dirname "$0")/cliff_check.py" "${cliff[@]}"
  fi
  for v in "${versus[@]}"; do
    # shellcheck disable=SC2086 # each entry is: OURS THEIRS FILE...
    run python3 "$(dirname "$0")/versus.py" $v
  done
fi
# PNG plots of every JSON file (bench/plot.py; needs matplotlib).
# apt's python3-matplotlib belongs to /usr/bin/python3; another python3 (pyenv,
# conda) may stand first on PATH without it.
plotpy=
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c "import matplotlib" 2>/dev/null; then plotpy=$py; break; fi
done
if [ -n "$plotpy" ]; then
  # (not the cliff reruns: single sizes, which would join the sweep's lines)
  plots=()
  for f in "$out"/*.json; do case $f in *-cliff-rerun-*) ;; *) plots+=("$f") ;; esac; done
  run "$plotpy" "$(dirname "$0")/plot.py" "$out/plots" "${plots[@]}"
else
  echo; echo "# plots: skipped (no python3 with matplotlib: apt-get install python3-matplotlib)"
fi
echo; echo "JSON results in $out"
