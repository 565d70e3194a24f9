#!/usr/bin/env bash
# ember run --grammar / --json-schema on a synthetic tiny model: bash run_grammar.sh EMBER_EXE FIXTURES_DIR BUILD_DIR.
# The output follows the grammar or schema (checked by pattern), and a grammar or schema that does
# not compile fails with a message naming the rule or the keyword.
set -u
ember=$1 fixtures=$2 build=$3
work=$build/cli-run-grammar
mkdir -p "$work"
model=$work/tiny-llama.gguf
fail() { echo "FAIL: $*"; exit 1; }
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" -o "$model" >"$work/synth.log" 2>&1 ||
  fail "ember synth: $(tail -5 "$work/synth.log")"

printf 'root ::= "The answer is " [0-9]{2} "."\n' >"$work/answer.gbnf"
for seed in 1 2 3; do
  out=$("$ember" run -m "$model" -p "Q:" --grammar "$work/answer.gbnf" --seed $seed -n 40 2>/dev/null) || fail "--grammar exited $?"
  [[ $out =~ ^The\ answer\ is\ [0-9]{2}\.$ ]] || fail "--grammar seed $seed: '$out'"
done
echo '{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":1,"maximum":9}},"required":["ok","n"],"additionalProperties":false}' >"$work/schema.json"
out=$("$ember" run -m "$model" -p "Q:" --json-schema "$work/schema.json" --seed 4 -n 60 2>/dev/null) || fail "--json-schema exited $?"
[[ $out =~ ^\{\ ?\"ok\"\ ?:\ ?(true|false)\ ?,\ ?\"n\"\ ?:\ ?[1-9]\ ?\}$ ]] || fail "--json-schema: '$out'"

printf 'root ::= answer\n' >"$work/bad.gbnf"
out=$("$ember" run -m "$model" -p "Q:" --grammar "$work/bad.gbnf" 2>&1) && fail "a bad grammar was accepted"
[[ $out == *"line 1, column 10: rule 'answer' is used but not defined"* ]] || fail "bad grammar: $out"
echo '{"type":"string","format":"ipv6"}' >"$work/bad.json"
out=$("$ember" run -m "$model" -p "Q:" --json-schema "$work/bad.json" 2>&1) && fail "a bad schema was accepted"
[[ $out == *"json schema at '/format': format \"ipv6\" is not supported"* ]] || fail "bad schema: $out"
echo "ok: run --grammar / --json-schema"
