#!/usr/bin/env bash
# Two builds of Ember side by side on the CPU (before and after a change): the same GGUF files, the
# same threads, the two binaries alternated round by round. Per model: prefill (a prompt of PREFILL
# token ids, one token generated) and decode (DECODE tokens after a prompt of DECODE_PROMPT), from
# each run's own timing lines; medians over the rounds and the median of the round-by-round ratios
# (B over A: above 1 means B is faster). On a shared machine only such paired ratios mean anything.
#
# Usage: bench/cpu_ab.sh EMBER_A EMBER_B MODEL.gguf... (ROUNDS=5 THREADS=2 PREFILL=512 DECODE=64
#        DECODE_PROMPT=300 in the environment)
set -u
a=$1 b=$2
shift 2
rounds=${ROUNDS:-5} threads=${THREADS:-2} prefill=${PREFILL:-512} decode=${DECODE:-64} decode_prompt=${DECODE_PROMPT:-300}
ids() { seq 1000 $((999 + $1)) | tr '\n' ' '; }
rate() { sed -n "s/^$1:.*[ (]\([0-9.]*\) tok\/s.*/\1/p" | head -n 1; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# ENGINE MEASURE: one run's tok/s
one() {
  if [ "$2" = prefill ]; then
    "$1" run -m "$model" --device cpu -t "$threads" --temp 0 -n 1 --prompt-ids "$(ids "$prefill")" 2>&1 | rate prefill
  else
    "$1" run -m "$model" --device cpu -t "$threads" --temp 0 -n "$decode" --ignore-eos \
      --prompt-ids "$(ids "$decode_prompt")" 2>&1 | rate decode
  fi
}
echo "| model | measure | A tok/s | B tok/s | B/A (median of rounds) |"
echo "|---|---|---|---|---|"
for model in "$@"; do
  work=$(mktemp -d)
  for m in prefill decode; do
    for r in $(seq "$rounds"); do
      one "$a" "$m" >>"$work/a.$m"
      one "$b" "$m" >>"$work/b.$m"
    done
    paste "$work/a.$m" "$work/b.$m" | awk '$1 && $2 { print $2 / $1 }' >"$work/ratio.$m"
    printf '| %s | %s | %s | %s | %.3f |\n' "$(basename "$model")" "$m" "$(median <"$work/a.$m")" \
      "$(median <"$work/b.$m")" "$(median <"$work/ratio.$m")"
  done
  rm -rf "$work"
done
