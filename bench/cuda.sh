#!/usr/bin/env bash
# The CUDA benchmarks of bench/RESULTS.md, per model: single-stream decode (256 greedy tokens after
# a 300-token prompt, three runs, median) against the memory-bandwidth bound (weight bytes read per
# token from `ember info`); with PREFILL="562 1971 8022 9289", cold prefill at those lengths
# (`ember bench --prefill`, median of 3); with CONCURRENCY="1 2 4 8 16", aggregate decode and host
# CPU at those numbers of concurrent requests (`ember bench --concurrency`; with WARM set the prompts
# are prefilled first, so the sum of decode rates is the steady aggregate of N decoding sequences).
#
#   [PREFILL="..."] [CONCURRENCY="..."] bench/cuda.sh BUILD_DIR VOCAB.gguf [preset:type ...]
set -u
build=$1 vocab=$2
shift 2
models=${*:-dense-1b:bf16 dense-1b:q8_0 dense-1b:q4_k flint:mix moe-30b-a3b:mix}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prompt=$(seq 1000 1299 | tr '\n' ' ')
"$(dirname "$0")/device_scale.sh"
for m in $models; do
  preset=${m%%:*} type=${m##*:}
  start=$(date +%s.%N)
  "$build/ember" synth --preset "$preset" --type "$type" -o "$dir/m.gguf" --vocab "$vocab" >/dev/null || continue
  synth_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  bytes=$("$build/ember" info "$dir/m.gguf" | sed -n 's/^read per token: *\([0-9]*\) bytes.*/\1/p')
  # the backend alone (no engine, no sampling): tests/cuda/check_cuda --bench
  [ -x "$build/tests/check_cuda" ] && "$build/tests/check_cuda" "$dir/m.gguf" "$m" "$type" --bench 2>/dev/null
  rates=()
  for run in 1 2 3; do
    out=$("$build/ember" run -m "$dir/m.gguf" --prompt-ids "$prompt" -n 256 --temp 0 --device cuda --print-ids 2>&1 >/dev/null)
    rate=$(echo "$out" | sed -n 's/^decode: \([0-9]*\) tokens, \([0-9.]*\) tok\/s/\2/p')
    prefill=$(echo "$out" | sed -n 's/^prefill: \([0-9.]*\) ms.*/\1/p')
    [ -z "$rate" ] && { echo "$m run $run failed: $out" | head -5; continue; }
    rates+=("$rate")
    echo "$m run $run: decode $rate tok/s, prefill $prefill ms"
  done
  [ -n "${PREFILL:-}" ] &&
    "$build/ember" bench -m "$dir/m.gguf" --device cuda --prefill "$(echo $PREFILL | tr ' ' ,)" --rounds 3 2>/dev/null |
    sed "s/^/$m /"
  [ -n "${CONCURRENCY:-}" ] &&
    "$build/ember" bench -m "$dir/m.gguf" --device cuda --concurrency "$(echo $CONCURRENCY | tr ' ' ,)" -n 256 \
      --rounds 2 ${WARM:+--warm-prompts} 2>/dev/null | sed "s/^/$m /"
  [ ${#rates[@]} -eq 0 ] && continue
  median=$(printf '%s\n' "${rates[@]}" | sort -n | sed -n "$(((${#rates[@]} + 1) / 2))p")
  awk -v m="$m" -v r="$median" -v b="$bytes" -v s="$synth_s" 'BEGIN {
    printf "%-18s median decode %8.1f tok/s  read/token %.3f GB  -> %.2f TB/s = %.0f%% of 4.8 TB/s  (synth %.1f s)\n",
      m, r, b / 1e9, r * b / 1e12, 100 * r * b / 4.8e12, s }'
done
