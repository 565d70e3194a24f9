#!/bin/bash
# Ember's importance-weighted quantizers write the bytes llama.cpp writes: tests/tools/imatrix_peer.c
# loads the libggml-base of node-llama-cpp 3.21.1 (llama.cpp's CPU build) and compares
# ggml_quantize_chunk with an importance vector against em_quantize_rows, type by type.
# usage: imatrix_peer.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
BUILD=$3
JS=$BUILD/js
mkdir -p "$BUILD/imatrix_peer"
. "$(dirname "$0")/../../tools/llamacpp_lib.sh"
need_llamacpp "$JS" "$BUILD/imatrix_peer/npm.log" || exit 1
lib=$JS/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so
[ -f "$lib" ] || { echo "FAIL: no libggml-base.so in the node-llama-cpp install ($lib)"; exit 1; }
"$BUILD/tests/imatrix_peer" "$lib"
