#!/usr/bin/env bash
# Serving under memory pressure on the CPU: tests/cuda/pressure.sh with tiny-llama, 8 clients with
# two conversations each of ~400 tokens, KV memory for two sequences of 1,024 tokens.
# usage: serve_pressure.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$build/cli_serve_pressure"
model=$build/cli_serve_pressure/tiny-llama.gguf
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 -o "$model" \
  --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" >/dev/null 2>&1 || { echo "FAIL: synth"; exit 1; }
exec bash "$here/../cuda/pressure.sh" "$ember" "$model" cpu 8 300 1024 2 2
