#!/usr/bin/env bash
# The tensor-core products (src/backend/cuda/gemm.cu) on a machine with a GPU: builds check_gemm
# unless BUILD already holds it, then runs it (tests/cuda/check_gemm.cu says what is compared and
# measured). Extra arguments go to check_gemm (--check: correctness only, no measurements).
#
#   tests/cuda/gemm.sh [BUILD_DIR] [--check]
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cuda}
shift $(( $# > 0 ? 1 : 0 ))
if [ ! -x "$build/tests/check_gemm" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$build" -j "$(nproc)" --target check_gemm >/dev/null || { echo "build failed"; exit 1; }
fi
exec "$build/tests/check_gemm" "$@"
