#!/usr/bin/env bash
# The suites most exposed to memory and threading bugs, rebuilt and run under
# sanitizers (run by hand: tests/sanitize.sh; not yet in README's test command): ASan+UBSan over call
# agreement, codecs' hostile-payload tests, fusion and the transports;
# TSan over the threaded ones (inproc ranks are threads, the fusion engine
# has a progress thread). Each build holds only these targets.
set -euo pipefail
cd "$(dirname "$0")/.."
common=(-Dbench=false -Dexamples=false -Dcuda=disabled -Dnccl=disabled -Dmpi=disabled -Dbuildtype=debugoptimized)

run() { # DIR SANITIZE "test:target ..."
  local dir=$1 san=$2 tests=() targets=()
  for pair in $3; do tests+=("${pair%%:*}"); targets+=("${pair#*:}"); done
  [ -d "$dir" ] || meson setup "$dir" "${common[@]}" -Db_sanitize="$san" -Db_lundef=false \
    -Dcpp_args=-fno-sanitize-recover=all
  ninja -C "$dir" "${targets[@]}"
  meson test -C "$dir" --no-rebuild --print-errorlogs "${tests[@]}"
}

# allocator_may_return_null: test_bounds asks for 2^60 elements and expects std::bad_alloc turned into an error
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run build-asan address,undefined "algo_verify:tests/algo/algo_verify compress_bounds:tests/compress/test_compress_bounds
  compress_corrupt:tests/compress/test_compress_corrupt fusion_engine:tests/fusion/fusion_engine
  transport_inproc:tests/transport/transport_inproc transport_shm:tests/transport/transport_shm"
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
run build-tsan thread "transport_inproc:tests/transport/transport_inproc fusion_engine:tests/fusion/fusion_engine
  algo_compressed:tests/algo/algo_compressed"
