#!/usr/bin/env bash
# `ember bench --concurrency` from the outside on a tiny model: one line per count with the fields
# bench/RESULTS.md quotes, every request's prompt from the prefix cache with --warm-prompts and none
# without, and clear errors for bad flags.
# usage: bench.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 fixtures=$2 build=$3
work=$build/cli_bench
mkdir -p "$work"
status=0
fail() { echo "FAIL: $*"; status=1; }
model=$work/tiny-llama.gguf
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 -o "$model" \
  --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" >/dev/null 2>&1 || fail "synth"

# field VALUE-OF KEY LINE
field() { sed -n "s/.*[ ^]$1=\([^ ]*\).*/\1/p" <<<" $2"; }

out=$("$ember" bench -m "$model" --device cpu -t 2 --concurrency 1,3 -n 6 --prompt-tokens 40 --rounds 1 --warm-prompts 2>/dev/null) ||
  fail "bench --warm-prompts exited $?"
[ "$(grep -c '^concurrency=' <<<"$out")" -eq 2 ] || fail "expected 2 lines, got: $out"
for n in 1 3; do
  line=$(grep "^concurrency=$n " <<<"$out")
  # each of the n requests finds all but the last prompt token cached
  [ "$(field cached_tokens "$line")" = $((n * 39)) ] || fail "concurrency $n cached: $line"
  [ "$(field warm_prompts "$line")" = 1 ] || fail "concurrency $n warm flag: $line"
  [ "$(field generated "$line")" = 6 ] || fail "concurrency $n generated: $line"
  awk -v r="$(field sum_decode_tok_s "$line")" 'BEGIN { exit !(r > 0) }' || fail "concurrency $n rate: $line"
done

# --ignore-eos (what bench always does: every request runs to -n) is accepted
line=$("$ember" bench -m "$model" --device cpu -t 2 --concurrency 2 -n 4 --prompt-tokens 40 --rounds 1 --ignore-eos \
       2>/dev/null) || fail "bench --ignore-eos exited $?"
[ "$(field cached_tokens "$line")" = 0 ] || fail "cold prompts cached: $line"
[ "$(field warm_prompts "$line")" = 0 ] || fail "cold warm flag: $line"
[ "$(field generated "$line")" = 4 ] || fail "cold generated: $line"

# --json-schema constrains every request: a schema of a few digits caps each answer below -n;
# a schema with an unsupported keyword fails, naming the file and the keyword
printf '{"type": "integer", "minimum": 0, "maximum": 99}' >"$work/small.json"
line=$("$ember" bench -m "$model" --device cpu -t 2 --concurrency 2 -n 16 --prompt-tokens 40 --rounds 1 \
       --json-schema "$work/small.json" 2>/dev/null) || fail "bench --json-schema exited $?"
gen=$(field generated "$line")
[ -n "$gen" ] && [ "$gen" -le 3 ] || fail "a two-digit schema generated $gen tokens: $line"
printf '{"type": "string", "contentEncoding": "base64"}' >"$work/bad.json"
err=$("$ember" bench -m "$model" --concurrency 1 -n 4 --json-schema "$work/bad.json" 2>&1 >/dev/null) &&
  fail "an unsupported schema accepted"
grep -q "bad.json" <<<"$err" && grep -q "contentEncoding" <<<"$err" || fail "bad schema message: $err"
err=$("$ember" bench -m "$model" --grammar "$work/x.gbnf" --json-schema "$work/small.json" 2>&1 >/dev/null) &&
  fail "--grammar with --json-schema accepted"

err=$("$ember" bench -m "$model" --concurrency 0 2>&1 >/dev/null) && fail "--concurrency 0 accepted"
grep -q -- "--concurrency" <<<"$err" || fail "--concurrency 0 message: $err"
err=$("$ember" bench -m "$model" --rounds 2>&1 >/dev/null) && fail "--rounds without a value accepted"
grep -q -- "--rounds needs a value" <<<"$err" || fail "--rounds message: $err"
exit $status
