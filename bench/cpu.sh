#!/usr/bin/env bash
# Ember against llama.cpp on the CPU, side by side: the same GGUF files, the same threads, the two
# engines alternated round by round. Per model: prefill (a prompt of PREFILL token ids, one token
# generated) and decode (DECODE tokens after a prompt of DECODE_PROMPT), each engine's own timings
# (ember run's lines; bench/cpu_llamacpp.mjs prints llama.cpp's in the same words), medians over the
# rounds and the median of the round-by-round ratios. llama.cpp is node-llama-cpp 3.21.1's CPU build,
# installed into BUILD_DIR/js as the peer tests install it.
#
# First the machine's read bandwidth with THREADS threads (bench/read_bandwidth.c, best of 7 passes
# over 1 GiB), and again after each round's Ember decode; each decode row then says how many GB/s of
# weights that rate reads (`ember info`'s bytes read per token times tok/s) and which share of the
# bandwidth that is: the median of the rounds' shares, each against the bandwidth read beside it.
#
# Without model files, the issue's set is written with `ember synth` into MODELS (default
# BUILD_DIR/bench-models): dense-1b q4_k, q8_0 and bf16 (16 layers) and moe-30b-a3b mix (q6_k with
# iq3_xxs experts) cut to MOE_LAYERS of its 48 layers (default 16, 4.5 GB; 48 needs about 13 GB).
# Each engine loads the weights its default way (Ember: read into memory where they fit, llama.cpp:
# mapped); EMBER_FLAGS (e.g. --mmap) adds flags to Ember's runs, LLAMA_MMAP=0 loads llama.cpp's into
# memory too (--no-mmap).
# Usage: bench/cpu.sh EMBER BUILD_DIR [MODEL.gguf...] (ROUNDS=5 THREADS=2 PREFILL=512 DECODE=64
#        DECODE_PROMPT=300 MOE_LAYERS=16 MODELS=DIR EMBER_FLAGS= LLAMA_MMAP= in the environment)
set -u
ember=$1 build=$2
shift 2
rounds=${ROUNDS:-5} threads=${THREADS:-2} prefill=${PREFILL:-512} decode=${DECODE:-64} decode_prompt=${DECODE_PROMPT:-300}
here=$(cd "$(dirname "$0")" && pwd)
js=$build/js
. "$here/../tools/llamacpp_lib.sh"
mkdir -p "$js"
need_llamacpp "$js" "$js/npm.log" || exit 1
if [ $# -eq 0 ]; then
  models=${MODELS:-$build/bench-models}
  mkdir -p "$models"
  for t in q4_k q8_0 bf16; do
    [ -s "$models/dense-1b-$t.gguf" ] ||
      "$ember" synth --preset dense-1b --type "$t" -o "$models/dense-1b-$t.gguf" >/dev/null || exit 1
    set -- "$@" "$models/dense-1b-$t.gguf"
  done
  moe="$models/moe-30b-a3b-mix-l${MOE_LAYERS:-16}.gguf"
  [ -s "$moe" ] || "$ember" synth --preset moe-30b-a3b --type mix --layers "${MOE_LAYERS:-16}" -o "$moe" >/dev/null ||
    exit 1
  set -- "$@" "$moe"
fi
cc -O2 -std=c11 "$here/read_bandwidth.c" -lpthread -o "$build/read_bandwidth" || exit 1
bandwidth=$("$build/read_bandwidth" "$threads" | tee /dev/stderr | sed -n 's/^read bandwidth: \([0-9.]*\) GB.*/\1/p')
ids() { seq 1000 $((999 + $1)) | tr '\n' ' '; } # ordinary token ids of every vocabulary here

# RATE LINE: the tok/s figure of `prefill:` or `decode:` in a run's output.
rate() { sed -n "s/^$1:.*[ (]\([0-9.]*\) tok\/s.*/\1/p" | head -n 1; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

echo "read bandwidth: $bandwidth GB/s with $threads threads"
echo
echo "| model | measure | Ember tok/s | llama.cpp tok/s | ratio (median of rounds) | weights read: Ember, llama.cpp (share of the bandwidth) |"
echo "|---|---|---|---|---|---|"
for model in "$@"; do
  work=$(mktemp -d)
  per_token=$("$ember" info "$model" | sed -n 's/^read per token: *\([0-9]*\) bytes.*/\1/p')
  for r in $(seq "$rounds"); do
    "$ember" run -m "$model" --device cpu -t "$threads" ${EMBER_FLAGS:-} --temp 0 -n 1 --prompt-ids "$(ids "$prefill")" 2>&1 |
      rate prefill >>"$work/ember.prefill"
    node "$here/cpu_llamacpp.mjs" "$js/node_modules" "$model" "$threads" 1 "$(ids "$prefill")" 2>&1 |
      rate prefill >>"$work/llama.prefill"
    "$ember" run -m "$model" --device cpu -t "$threads" ${EMBER_FLAGS:-} --temp 0 -n "$decode" --ignore-eos \
      --prompt-ids "$(ids "$decode_prompt")" 2>&1 | rate decode >>"$work/ember.decode"
    "$build/read_bandwidth" "$threads" | sed -n 's/^read bandwidth: \([0-9.]*\) GB.*/\1/p' >>"$work/bandwidth"
    node "$here/cpu_llamacpp.mjs" "$js/node_modules" "$model" "$threads" "$decode" "$(ids "$decode_prompt")" 2>&1 |
      rate decode >>"$work/llama.decode"
  done
  for m in prefill decode; do
    paste "$work/ember.$m" "$work/llama.$m" | awk '$1 && $2 { print $1 / $2 }' >"$work/ratio.$m"
    ember_rate=$(median <"$work/ember.$m") llama_rate=$(median <"$work/llama.$m") read=
    if [ "$m" = decode ] && [ -n "$per_token" ]; then
      # each round's share of the bandwidth read right after its decode, then the median: the machine's
      # bandwidth moves (other tenants), and a share of a figure read minutes apart says little
      paste "$work/ember.decode" "$work/llama.decode" "$work/bandwidth" |
        awk -v b="$per_token" '$1 && $2 && $3 { print 100 * $1 * b / 1e9 / $3, 100 * $2 * b / 1e9 / $3 }' >"$work/shares"
      read=$(printf '%.1f GB/s (%.0f%%), %.1f GB/s (%.0f%%); bandwidth %s GB/s' \
        "$(awk -v e="${ember_rate:-0}" -v b="$per_token" 'BEGIN { print e * b / 1e9 }')" \
        "$(cut -d' ' -f1 "$work/shares" | median)" \
        "$(awk -v l="${llama_rate:-0}" -v b="$per_token" 'BEGIN { print l * b / 1e9 }')" \
        "$(cut -d' ' -f2 "$work/shares" | median)" "$(median <"$work/bandwidth")")
    fi
    printf '| %s | %s | %s | %s | %s | %s |\n' "$(basename "$model")" "$m" "$ember_rate" "$llama_rate" \
      "$(median <"$work/ratio.$m")" "$read"
  done
  rm -rf "$work"
done
