#!/usr/bin/env bash
# Builds and runs the codecs' GPU test + bench (tests/gpu/test_codecs_gpu.cu),
# the CUDA executor's test (tests/exec/test_cuda_executor.cu), the staged
# collectives on device memory (tests/gpu/test_staged_gpu.cu), the CUDA-IPC
# transport (test_cuda_ipc_gpu.cu) and the NCCL transport (test_nccl_gpu.cu,
# where libnccl is installed) on a machine
# with a CUDA GPU, printing versions, the checks and the GB/s table. Meant to
# finish in well under 8 minutes on an H100/H200.
#
#   tests/gpu/run.sh [BENCH_MiB]        (default 256 MiB of float input)
#
# Environment: BUILD (build directory, default /tmp/gradsync-gpu-build; it is
# recreated), CUDA_HOME (default /usr/local/cuda), REPS (bench repetitions, 20),
# PREBUILT (a folder holding test_codecs_gpu, exec_cuda and, optionally,
# test_staged_gpu, test_cuda_ipc_gpu, test_nccl_gpu and gradsync-bench built
# elsewhere with these flags, e.g. copied out of a build-test here: used
# instead of building when every library they need resolves there), JSON_DIR (where
# gradsync-bench compress --device gpu writes its JSON, when it runs),
# BUILD_WITH=nvcc (skip meson even where it is installed: compile the test
# programs with nvcc alone; doctest found through CPLUS_INCLUDE_PATH).
# Uses meson + ninja when they (and doctest, which tests/meson.build needs)
# are installed, else compiles each test's one translation unit with nvcc
# directly, with the same flags as tests/gpu/meson.build (the two doctest
# suites only when doctest is found).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
mib=${1:-256}
build=${BUILD:-/tmp/gradsync-gpu-build}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
reps=${REPS:-20}
export PATH="$cuda_home/bin:$PATH"
start=$(date +%s)

section() { printf '\n==== %s (%ss)\n' "$1" "$(($(date +%s) - start))"; }

section "versions"
git rev-parse --short HEAD 2>/dev/null || echo "(not a git checkout)"
if ! command -v nvcc >/dev/null; then
  echo "nvcc not found (looked in PATH and $cuda_home/bin)" >&2
  exit 1
fi
nvcc --version | tail -n 2
"${CXX:-g++}" --version | head -n 1 || true
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  nvidia-smi | head -n 15 || true
else
  echo "nvidia-smi not found"
fi

# The flags of tests/gpu/meson.build (keep them in step).
arch_flags=(-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 -fmad=false)

have_doctest=0
if printf '#include <doctest/doctest.h>\n' | "${CXX:-g++}" -std=c++20 -fsyntax-only -x c++ - 2>/dev/null; then
  have_doctest=1
fi
have_meson=0
if [ "${BUILD_WITH:-meson}" != nvcc ] && command -v meson >/dev/null && command -v ninja >/dev/null &&
  [ "$have_doctest" = 1 ]; then
  have_meson=1
fi

prebuilt_ok=0
if [ -n "${PREBUILT:-}" ] && [ -x "$PREBUILT/test_codecs_gpu" ] && [ -x "$PREBUILT/exec_cuda" ]; then
  prebuilt_ok=1
  for b in "$PREBUILT"/*; do
    if ldd "$b" 2>&1 | grep -q 'not found'; then
      echo "prebuilt $b does not load here:"; ldd "$b" | grep 'not found'
      prebuilt_ok=0
    fi
  done
fi

# The doctest suites beside the codecs' test: name, source, ninja target.
suites=(
  "executor|tests/exec/test_cuda_executor.cu|tests/exec/exec_cuda"
  "staged|tests/gpu/test_staged_gpu.cu|tests/gpu/test_staged_gpu"
  "cuda_ipc|tests/gpu/test_cuda_ipc_gpu.cu|tests/gpu/test_cuda_ipc_gpu"
  "nccl|tests/gpu/test_nccl_gpu.cu|tests/gpu/test_nccl_gpu"
)
have_nccl=0
[ -e "$cuda_home/lib64/libnccl.so" ] && [ -e "$cuda_home/include/nccl.h" ] && have_nccl=1
declare -A suite_bin=()
bench_bin=""
rm -rf "$build"
if [ "$prebuilt_ok" = 1 ]; then
  section "using the prebuilt binaries in $PREBUILT"
  bin="$PREBUILT/test_codecs_gpu"
  for s in "${suites[@]}"; do
    IFS='|' read -r name src target <<<"$s"
    [ -x "$PREBUILT/$(basename "$target")" ] && suite_bin[$name]="$PREBUILT/$(basename "$target")"
  done
  [ -x "$PREBUILT/gradsync-bench" ] && bench_bin="$PREBUILT/gradsync-bench"
elif [ "$have_meson" = 1 ]; then
  section "meson $(meson --version), ninja $(ninja --version)"
  # Only what the GPU tests need: no bench, examples or MPI.
  meson setup "$build" -Dcuda=enabled -Dbench=false -Dexamples=false -Dmpi=disabled \
    -Dtests=true >"$build.setup.log" 2>&1 || {
    cat "$build.setup.log"
    exit 1
  }
  tail -n 8 "$build.setup.log"
  targets=(tests/gpu/test_codecs_gpu)
  for s in "${suites[@]}"; do
    IFS='|' read -r name src target <<<"$s"
    [ "$name" = nccl ] && [ "$have_nccl" = 0 ] && continue
    targets+=("$target")
    suite_bin[$name]="$build/$target"
  done
  ninja -C "$build" -j "$(nproc)" "${targets[@]}"
  bin="$build/tests/gpu/test_codecs_gpu"
else
  section "meson/ninja/doctest missing: building with nvcc directly"
  mkdir -p "$build"
  nvcc -std=c++20 -O3 -DNDEBUG "${arch_flags[@]}" -Xcompiler=-Wall,-Wextra -Iinclude \
    tests/gpu/test_codecs_gpu.cu -o "$build/test_codecs_gpu"
  bin="$build/test_codecs_gpu"
  if [ "$have_doctest" = 1 ]; then # the other suites are doctest suites
    for s in "${suites[@]}"; do
      IFS='|' read -r name src target <<<"$s"
      libs=()
      if [ "$name" = nccl ]; then
        [ "$have_nccl" = 0 ] && continue
        libs=(-lnccl)
      fi
      nvcc -std=c++20 -O3 -DNDEBUG "${arch_flags[@]}" -Xcompiler=-Wall,-Wextra -Iinclude -Itests \
        "$src" -o "$build/$(basename "$target")" -L"$cuda_home/lib64" "${libs[@]}"
      suite_bin[$name]="$build/$(basename "$target")"
    done
  fi
fi

section "correctness: device vs host"
set +e
timeout 300 "$bin"
rc=$?
set -e
case $rc in
  0) echo "correctness: PASS" ;;
  77) echo "correctness: SKIPPED (no CUDA device visible)"; exit 77 ;;
  *) echo "correctness: FAIL (exit $rc)" ;;
esac

# Each doctest suite: PASS / FAIL / NOT BUILT; any failure fails the script.
suites_rc=0
for s in "${suites[@]}"; do
  IFS='|' read -r name src target <<<"$s"
  section "correctness: $name ($src)"
  if [ -z "${suite_bin[$name]:-}" ]; then
    echo "$name: NOT BUILT"
    continue
  fi
  set +e
  timeout 300 "${suite_bin[$name]}"
  src_rc=$?
  set -e
  case $src_rc in
    0) echo "$name: PASS" ;;
    *) echo "$name: FAIL (exit $src_rc)"; suites_rc=1 ;;
  esac
done

section "bench: $mib MiB of float input"
set +e
timeout 300 "$bin" --bench "$mib" --reps "$reps"
brc=$?
set -e
if [ -n "$bench_bin" ]; then
  section "gradsync-bench compress --device gpu"
  json_dir=${JSON_DIR:-$build}
  mkdir -p "$json_dir"
  set +e
  timeout 240 "$bench_bin" compress --device gpu -z fp16 -z bf16 -z int8 -z int4 -z sign -z qsgd \
    -z terngrad -z topk:density=0.01 -z approx_topk:density=0.01 -z randk:density=0.01 \
    -b 1M -e 512M -f 8 --json "$json_dir/compress_gpu.json"
  crc=$?
  set -e
  echo "gradsync-bench compress --device gpu: exit $crc"
  # The collectives on device buffers, staged through pinned host memory,
  # 2 ranks on the one GPU, with the run's copy bandwidths beside them.
  for t in inproc shm; do
    section "gradsync-bench allreduce --device gpu -t $t --ranks 2"
    set +e
    timeout 120 "$bench_bin" allreduce --device gpu -t "$t" --ranks 2 -a auto,ring,rd,tree -b 1M -e 256M -f 4 \
      --json "$json_dir/allreduce_gpu_$t.json"
    echo "gradsync-bench allreduce --device gpu -t $t: exit $?"
    set -e
  done
fi
section "done"
[ "$rc" = 0 ] && [ "$suites_rc" = 0 ] && [ "$brc" = 0 ]
