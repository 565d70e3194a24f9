#!/usr/bin/env bash
# The CUDA backend against the CPU reference, on a machine with a GPU (tests/cuda/check_cuda.c says
# what is compared). Builds ember and check_cuda unless BUILD already holds them, synthesizes every
# family's tiny preset in each weight type, plus a few layers of the real-shape presets (whose rows
# are long enough for the 256-element formats: q4_k, q6_k, iq3_xxs), and prints a pass/fail table.
#
#   [ONLY=REGEX] tests/cuda/run.sh [BUILD_DIR] [VOCAB.gguf]   (ONLY: the rows whose "LABEL TYPE" match)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cuda}
vocab=${2:-$root/../shared/fixtures/vocab/ggml-vocab-llama-spm.gguf}
if [ ! -x "$build/tests/check_cuda" ] || [ ! -x "$build/ember" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$build" -j "$(nproc)" --target ember check_cuda >/dev/null || { echo "build failed"; exit 1; }
fi
models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
pass=0 fail=0
# The device decoders against the CPU reference, and the switches and kernel choice against
# docs/cuda.md, on the host (no GPU needed).
for host_check in check_decoders check_tuning; do
  if [ -x "$build/tests/$host_check" ]; then
    if "$build/tests/$host_check"; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
  fi
done
# check_cuda on FILE, counted.
verify() { # LABEL TYPE FILE
  if timeout 300 "$build/tests/check_cuda" "$3" "$1" "$2" 2>"$models/err"; then
    pass=$((pass + 1))
  else
    grep -v ': info:' "$models/err" >"$models/err2"
    [ -s "$models/err2" ] && printf '%-14s %-7s %s  FAIL\n' "$1" "$2" "$(head -c 300 "$models/err2" | tr '\n' ' ')"
    fail=$((fail + 1))
  fi
}
failed_to_make() { # LABEL TYPE WHAT
  printf '%-14s %-7s %s failed: %s  FAIL\n' "$1" "$2" "$3" "$(head -c 200 "$models/err")"
  fail=$((fail + 1))
}
check() { # LABEL TYPE SYNTH-ARGS...
  local label=$1 type=$2
  shift 2
  [ -n "${ONLY:-}" ] && ! [[ "$label $type" =~ $ONLY ]] && return
  if ! "$build/ember" synth "$@" --type "$type" -o "$models/m.gguf" --vocab "$vocab" >/dev/null 2>"$models/err"; then
    failed_to_make "$label" "$type" synth
    return
  fi
  verify "$label" "$type" "$models/m.gguf"
}
for family in llama qwen2 qwen3 qwen3moe gemma2 gemma3 mixtral flint; do
  for type in f32 bf16 q8_0 q4_k mix; do check "tiny-$family" "$type" --preset "tiny-$family"; done
done
for type in bf16 q8_0 q4_k mix; do check "dense-1b/L2" "$type" --preset dense-1b --layers 2; done
# llama.cpp's file types through `ember quantize` (Q5_K, Q3_K, IQ4_XS and Q2_K tensors beside Q4_K, Q6_K
# and IQ3_XXS), on a preset whose rows the K blocks divide.
checkq() { # LABEL TYPE PRESET [SYNTH-ARGS...]
  local label=$1 type=$2 preset=$3
  shift 3
  [ -n "${ONLY:-}" ] && ! [[ "$label $type" =~ $ONLY ]] && return
  if ! "$build/ember" synth --preset "$preset" "$@" --type f32 -o "$models/f.gguf" --vocab "$vocab" >/dev/null 2>"$models/err" ||
    ! "$build/ember" quantize "$models/f.gguf" "$models/q.gguf" "$type" >/dev/null 2>"$models/err"; then
    failed_to_make "$label" "$type" quantize
    return
  fi
  verify "$label" "$type" "$models/q.gguf"
}
for type in Q5_K_M Q5_K_S Q4_K_S Q3_K_M IQ4_XS Q4_K_M IQ3_XXS Q2_K; do checkq small-llama "$type" small-llama; done
checkq small-moe Q4_K_S small-qwen3moe
# MXFP4 experts (llama.cpp's MXFP4_MOE: the expert stacks in MXFP4, the other matrices Q8_0), as
# gpt-oss keeps them: tiny and small shapes, and two layers of moe-30b-a3b cut to 32 experts (a
# served prefill of LONG tokens then gives each expert enough tokens for the wgmma tiles).
checkq tiny-moe MXFP4_MOE tiny-qwen3moe
checkq small-moe MXFP4_MOE small-qwen3moe
checkq moe-30b/L2 MXFP4_MOE moe-30b-a3b --layers 2 --experts 32
check "flint/L3" mix --preset flint --layers 3
check "moe-30b/L2" mix --preset moe-30b-a3b --layers 2
# Speculative decoding through the engine on the GPU: outputs with drafts equal those without.
if [ -z "${ONLY:-}" ] || [[ "speculative" =~ $ONLY ]]; then
  # (a build carried from another machine brings the program; one made here builds it)
  if { [ -x "$build/tests/test_engine_spec" ] || cmake --build "$build" -j "$(nproc)" --target test_engine_spec >/dev/null; } &&
    (cd "$build" && EMBER_TEST_DEVICE=cuda timeout 600 tests/test_engine_spec >"$models/spec" 2>&1); then
    pass=$((pass + 1))
  else
    printf '%-14s %-7s %s  FAIL\n' speculative engine "$(grep -E 'FAILED|error' "$models/spec" | head -c 300 | tr '\n' ' ')"
    fail=$((fail + 1))
  fi
fi
echo "passed $pass, failed $fail"
[ "$fail" -eq 0 ]
