#!/usr/bin/env bash
# The persistent decode kernel (src/backend/cuda/mega.cu) against the per-operation kernels
# (EMBER_CUDA_MEGA=0) on the real-shape dense presets: single-stream decode of 256 greedy tokens
# after a 300-token prompt (`ember run`, three runs each, median), and aggregate decode of 1, 2, 4
# sequences from warm prompts (`ember bench --concurrency 1,2,4 --warm-prompts`), with the weight
# bytes read per token (`ember info`) and a device-to-device copy in the same run for scale.
#
#   bench/mega.sh BUILD_DIR VOCAB.gguf [preset:type ...]
set -u
build=$1 vocab=$2
shift 2
models=${*:-dense-1b:bf16 dense-1b:q8_0 dense-1b:q4_k}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prompt=$(seq 1000 1299 | tr '\n' ' ')
"$(dirname "$0")/device_scale.sh"
for m in $models; do
  preset=${m%%:*} type=${m##*:}
  "$build/ember" synth --preset "$preset" --type "$type" -o "$dir/m.gguf" --vocab "$vocab" >/dev/null || continue
  bytes=$("$build/ember" info "$dir/m.gguf" | sed -n 's/^read per token: *\([0-9]*\) bytes.*/\1/p')
  for mega in 4 0; do
    rates=()
    for run in 1 2 3; do
      out=$(EMBER_CUDA_MEGA=$mega "$build/ember" run -m "$dir/m.gguf" --prompt-ids "$prompt" -n 256 --temp 0 \
            --device cuda --print-ids 2>&1 >"$dir/ids.$mega")
      rate=$(echo "$out" | sed -n 's/^decode: \([0-9]*\) tokens, \([0-9.]*\) tok\/s/\2/p')
      [ -z "$rate" ] && { echo "$m mega=$mega run $run failed: $out" | head -5; continue; }
      rates+=("$rate")
    done
    [ ${#rates[@]} -eq 0 ] && continue
    echo "$out" | grep 'mega profile' | sed "s/^/$m /" # with EMBER_CUDA_MEGA_PROFILE set: the last run's
    median=$(printf '%s\n' "${rates[@]}" | sort -n | sed -n "$(((${#rates[@]} + 1) / 2))p")
    awk -v m="$m" -v k="$mega" -v r="$median" -v b="$bytes" -v all="${rates[*]}" 'BEGIN {
      printf "%-14s mega=%s decode %7.1f tok/s (runs: %s)  %.3f GB/token -> %.2f TB/s\n", m, k, r, all, b / 1e9, r * b / 1e12 }'
    EMBER_CUDA_MEGA=$mega "$build/ember" bench -m "$dir/m.gguf" --device cuda --concurrency 1,2,4 -n 256 --rounds 3 \
      --warm-prompts 2>/dev/null | sed "s/^/$m mega=$mega /"
  done
  cmp -s "$dir/ids.4" "$dir/ids.0" && echo "$m: 256 greedy ids equal with and without the kernel" ||
    { echo "$m: greedy ids differ:"; diff <(tr ' ' '\n' <"$dir/ids.4") <(tr ' ' '\n' <"$dir/ids.0") | head -4; }
done
