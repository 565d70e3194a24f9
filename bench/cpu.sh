#!/usr/bin/env bash
# Ember against llama.cpp on the CPU, side by side: the same GGUF files, the same threads, the two
# engines alternated round by round. Per model: prefill (a prompt of PREFILL token ids, one token
# generated) and decode (DECODE tokens after a prompt of DECODE_PROMPT), each engine's own timings
# (ember run's lines; bench/cpu_llamacpp.mjs prints llama.cpp's in the same words), medians over the
# rounds and the median of the round-by-round ratios. llama.cpp is node-llama-cpp 3.21.1's CPU build,
# installed into BUILD_DIR/js as the peer tests install it.
# Usage: bench/cpu.sh EMBER BUILD_DIR MODEL.gguf... (ROUNDS=5 THREADS=2 PREFILL=512 DECODE=64
#        DECODE_PROMPT=300 in the environment)
set -u
ember=$1 build=$2
shift 2
rounds=${ROUNDS:-5} threads=${THREADS:-2} prefill=${PREFILL:-512} decode=${DECODE:-64} decode_prompt=${DECODE_PROMPT:-300}
here=$(cd "$(dirname "$0")" && pwd)
js=$build/js
. "$here/../tools/llamacpp_lib.sh"
mkdir -p "$js"
need_llamacpp "$js" "$js/npm.log" || exit 1
ids() { seq 1000 $((999 + $1)) | tr '\n' ' '; } # ordinary token ids of every vocabulary here

# RATE LINE: the tok/s figure of `prefill:` or `decode:` in a run's output.
rate() { sed -n "s/^$1:.*[ (]\([0-9.]*\) tok\/s.*/\1/p" | head -n 1; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

echo "| model | measure | Ember tok/s | llama.cpp tok/s | ratio (median of rounds) |"
echo "|---|---|---|---|---|"
for model in "$@"; do
  work=$(mktemp -d)
  for r in $(seq "$rounds"); do
    "$ember" run -m "$model" --device cpu -t "$threads" --temp 0 -n 1 --prompt-ids "$(ids "$prefill")" 2>&1 |
      rate prefill >>"$work/ember.prefill"
    node "$here/cpu_llamacpp.mjs" "$js/node_modules" "$model" "$threads" 1 "$(ids "$prefill")" 2>&1 |
      rate prefill >>"$work/llama.prefill"
    "$ember" run -m "$model" --device cpu -t "$threads" --temp 0 -n "$decode" --ignore-eos \
      --prompt-ids "$(ids "$decode_prompt")" 2>&1 | rate decode >>"$work/ember.decode"
    node "$here/cpu_llamacpp.mjs" "$js/node_modules" "$model" "$threads" "$decode" "$(ids "$decode_prompt")" 2>&1 |
      rate decode >>"$work/llama.decode"
  done
  for m in prefill decode; do
    paste "$work/ember.$m" "$work/llama.$m" | awk '$1 && $2 { print $1 / $2 }' >"$work/ratio.$m"
    printf '| %s | %s | %s | %s | %s |\n' "$(basename "$model")" "$m" "$(median <"$work/ember.$m")" \
      "$(median <"$work/llama.$m")" "$(median <"$work/ratio.$m")"
  done
  rm -rf "$work"
done
