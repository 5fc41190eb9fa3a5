#!/usr/bin/env bash
# Runs the sanitizer suite (tests/sanitize/meson.build: ASan+UBSan over the
# hostile-input, agreement and transport suites, TSan over the threaded ones)
# on its own, in a build holding only what it needs. The same suite runs in
# every `meson test`, so README's test command and CI run it too.
#   tests/sanitize.sh [BUILD_DIR]   (default build-sanitize)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-sanitize}
[ -d "$dir" ] || meson setup "$dir" -Dbench=false -Dexamples=false -Dcuda=disabled -Dnccl=disabled \
  -Dmpi=disabled -Dtorch=disabled
targets=$(ninja -C "$dir" -t targets all | sed -n 's|^\(tests/sanitize/[at]san_[a-z_]*\): .*|\1|p')
[ -n "$targets" ] || { echo "tests/sanitize.sh: no sanitizer targets in $dir (-Dsanitize_suite=false?)" >&2; exit 2; }
ninja -C "$dir" $targets
meson test -C "$dir" --no-rebuild --print-errorlogs --suite sanitize
