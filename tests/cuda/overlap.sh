#!/usr/bin/env bash
# Step overlap on the GPU (a machine with one): the engine's pipelined steps (pick_begin /
# pick_end) must give the tokens the step-by-step path gives. For each model: greedy and seeded
# sampling through `ember run`, with EMBER_CUDA_OVERLAP=0 and with the default; the ids must match.
#
#   tests/cuda/overlap.sh BUILD_DIR VOCAB.gguf
set -u
build=$1 vocab=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
for m in tiny-llama:q8_0 tiny-qwen3moe:mix dense-1b:bf16; do
  preset=${m%%:*} type=${m##*:}
  args=(--preset "$preset" --type "$type")
  [ "$preset" = dense-1b ] && args+=(--layers 2)
  "$build/ember" synth "${args[@]}" -o "$dir/m.gguf" --vocab "$vocab" >/dev/null 2>&1 || { echo "$m: synth failed"; fail=1; continue; }
  for sampling in "--temp 0" "--temp 0.8 --top-k 40 --seed 7"; do
    run() { "$build/ember" run -m "$dir/m.gguf" --prompt-ids "1 450 4996 263 1243" -n 64 $sampling --device cuda --print-ids 2>/dev/null; }
    a=$(EMBER_CUDA_OVERLAP=0 run) b=$(run)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS $m $sampling"; else echo "FAIL $m $sampling: '$a' vs '$b'"; fail=1; fi
  done
done
exit $fail
