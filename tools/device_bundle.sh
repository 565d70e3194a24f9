#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run tests/cuda/run.sh and the CUDA benchmarks from a build
# made elsewhere: the ember program, the CUDA check programs and the engine's speculative test, and every shared library they link
# except the C library's own and the NVIDIA driver's (the machine has those), into one tar.xz whose
# lib/ goes on LD_LIBRARY_PATH there.
#
#   tools/device_bundle.sh BUILD_DIR OUT.tar.xz [PROGRAM...]   (names under BUILD_DIR/tests)
#   EMBER_PROGRAM=FILE takes the ember program from elsewhere (tests/cuda/run.sh only synthesizes and
#   quantizes with it, which a build without CUDA does as well, in a fraction of the bytes)
#   (there:) tar xf OUT.tar.xz && LD_LIBRARY_PATH=$PWD/bundle/lib tests/cuda/run.sh $PWD/bundle
set -eu
build=$1 out=$2
shift 2
[ $# -eq 0 ] && set -- check_cuda check_decoders
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bundle/tests" "$work/bundle/lib"
cp "${EMBER_PROGRAM:-$build/ember}" "$work/bundle/ember"
for program in "$@"; do
  cp "$build/tests/$program" "$work/bundle/tests/"
done
strip "$work/bundle/ember" "$work"/bundle/tests/*
for binary in "$work/bundle/ember" "$work"/bundle/tests/*; do
  ldd "$binary" | awk '$3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
  libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | libcuda.so.* | libnvidia*) ;;
  *) cp -L "$lib" "$work/bundle/lib/" ;;
  esac
done
tar -C "$work" -cJf "$out" bundle
echo "$out: $(du -h "$out" | cut -f1)"
