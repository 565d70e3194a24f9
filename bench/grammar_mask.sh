#!/usr/bin/env bash
# The mask time per token per constrained sequence (bench/grammar_mask.c), for the grammar of
# bench/RESULTS.md's grammar-mask rows (`json`), at 1 and 16 sequences, with and without the
# shared mask cache; then the first walks of parse states by the trie walk and from the grammar's
# position tables side by side ("pair"; PAIR=0 leaves it out, for builds without position tables):
#   bash bench/grammar_mask.sh BUILD_DIR [VOCAB.gguf] [TOKENS] [ROUNDS]
# BUILD_DIR holds libember_core.a (a Release build). The vocabulary defaults to the reference
# fixtures' llama-spm (32,000 tokens, the one of the tiny-llama test model).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: grammar_mask.sh BUILD_DIR [VOCAB.gguf] [TOKENS] [ROUNDS]}
vocab=${2:-$root/tests/fixtures/reference/vocab/ggml-vocab-llama-spm.gguf}
tokens=${3:-128}
rounds=${4:-5}
pair=${PAIR:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I"$root/src" "$root/bench/grammar_mask.c" "$build/libember_core.a" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o "$work/grammar_mask"
cat >"$work/json.gbnf" <<'GBNF'
root ::= "[" ws item ("," ws item)* "]"
item ::= "{" ws "\"id\": " [0-9]{1,6} ", \"name\": \"" [a-z ]{1,24} "\"" ws "}"
ws ::= [ \n]?
GBNF
# llama.cpp's grammars/json.gbnf (any JSON object): nesting puts the same positions (a string's
# characters, say) under ever new stacks, the case position tables are for.
cat >"$work/object.gbnf" <<'GBNF'
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
GBNF
for grammar in ${GRAMMARS:-json object}; do
  for seqs in 1 16; do
    for share in off on; do
      echo "grammar=$grammar seqs=$seqs share=$share" \
        "$("$work/grammar_mask" "$vocab" "$work/$grammar.gbnf" "$seqs" "$tokens" "$rounds" "$share")"
    done
  done
  [ "$pair" = 1 ] &&
    echo "grammar=$grammar pair $("$work/grammar_mask" "$vocab" "$work/$grammar.gbnf" 1 "$tokens" "$rounds" pair)"
done
