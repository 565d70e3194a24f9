#!/usr/bin/env bash
# Two CUDA builds of Ember side by side on one GPU (before and after a change), alternated round by
# round on the same GGUF files: single-stream decode (256 greedy tokens after a 300-token prompt,
# `ember run`), cold prefill at PREFILL lengths (`ember bench --prefill`, the median of its rounds)
# and aggregate decode at CONCURRENCY sequences (`ember bench --concurrency --warm-prompts`). Prints
# each measure's medians over the rounds and the median of the round-by-round ratios (B over A: above
# 1 means B is faster; for prefill, A's time over B's).
#
# Usage: bench/cuda_ab.sh EMBER_A EMBER_B VOCAB.gguf preset:type... (ROUNDS=3 PREFILL="562 1971 8022"
#        CONCURRENCY="1 16" in the environment; the files are synthesized with EMBER_A)
set -u
a=$1 b=$2 vocab=$3
shift 3
rounds=${ROUNDS:-3} prefill=${PREFILL:-562 1971 8022} concurrency=${CONCURRENCY:-1 16}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prompt=$(seq 1000 1299 | tr '\n' ' ')
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# ENGINE MODEL MEASURE: one value per line, in the order the measure names them
one() {
  case $3 in
  decode)
    "$1" run -m "$2" --prompt-ids "$prompt" -n 256 --temp 0 --device cuda --print-ids 2>&1 >/dev/null |
      sed -n 's/^decode: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' ;;
  prefill)
    "$1" bench -m "$2" --device cuda --prefill "$(echo $prefill | tr ' ' ,)" --rounds 3 2>/dev/null |
      sed -n 's/^prefill_tokens=[0-9]* prefill_ms=\([0-9.]*\).*/\1/p' ;;
  concurrency)
    "$1" bench -m "$2" --device cuda --concurrency "$(echo $concurrency | tr ' ' ,)" -n 256 --rounds 1 --warm-prompts 2>/dev/null |
      sed -n 's/^concurrency=.* sum_decode_tok_s=\([0-9.]*\) .*/\1/p' ;;
  esac
}
echo "| model | measure | A | B | B/A (median of rounds) |"
echo "|---|---|---|---|---|"
for m in "$@"; do
  preset=${m%%:*} type=${m##*:}
  "$a" synth --preset "$preset" --type "$type" -o "$dir/m.gguf" --vocab "$vocab" >/dev/null || continue
  for measure in decode prefill concurrency; do
    for r in $(seq "$rounds"); do
      one "$a" "$dir/m.gguf" $measure >"$dir/a.$r"
      one "$b" "$dir/m.gguf" $measure >"$dir/b.$r"
    done
    labels=$measure
    [ $measure = prefill ] && labels=$prefill
    [ $measure = concurrency ] && labels=$concurrency
    i=0
    for label in $labels; do
      i=$((i + 1))
      for r in $(seq "$rounds"); do
        va=$(sed -n "${i}p" "$dir/a.$r") vb=$(sed -n "${i}p" "$dir/b.$r")
        [ -n "$va" ] && [ -n "$vb" ] || continue
        echo "$va" >>"$dir/A" && echo "$vb" >>"$dir/B"
        # time (prefill ms): A over B; rate: B over A
        awk -v x="$va" -v y="$vb" -v t=$measure 'BEGIN { print (t == "prefill" ? x / y : y / x) }' >>"$dir/R"
      done
      unit=tok/s
      [ $measure = prefill ] && unit="ms, $label tokens"
      [ $measure = concurrency ] && unit="tok/s, $label streams"
      printf '| %s | %s (%s) | %s | %s | %.3f |\n' "$m" "$measure" "$unit" "$(median <"$dir/A")" "$(median <"$dir/B")" \
        "$(median <"$dir/R")"
      rm -f "$dir/A" "$dir/B" "$dir/R"
    done
  done
  rm -f "$dir/m.gguf"
done
