#!/bin/bash
# llama.cpp reads what `ember convert` writes the way transformers meant it: node-llama-cpp 3.21.1
# (llama.cpp, CPU build) continues each converted transformers checkpoint of tests/fixtures/hf
# greedily and must produce transformers' 16 greedy tokens. This pins the conventions a GGUF file
# shares with llama.cpp (Q/K row permutation of `llama`, Gemma's stored 1 + w norms, expert
# stacking, rope_freqs, metadata keys) against llama.cpp itself rather than against Ember's loader.
# Mistral is left out: llama.cpp's `llama` graph has no sliding window, so it answers as if the
# window were absent (Ember's loader applies llama.attention.sliding_window; tests/test_convert.c).
# usage: convert_peer.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 BUILD=$3
HERE=$(cd "$(dirname "$0")" && pwd)
HF=$HERE/../fixtures/hf
JS=$BUILD/js
WORK=$BUILD/convert_peer
mkdir -p "$WORK"
. "$(dirname "$0")/../../tools/llamacpp_lib.sh"
need_llamacpp "$JS" "$WORK/npm.log" || exit 1
ids() { tr -d ' \n' <"$HF/$1/expected.json" | sed -e "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/" | tr ',' ' '; }

status=0
families="llama mixtral qwen2 qwen3 qwen3moe gemma2 gemma3 gemma3mm"
# the fixtures made on a machine with transformers 5.x (tools/reference/make_hf_fixtures.py), once
# they are in the tree
for family in qwen35; do
    if [ -f "$HF/$family/expected.json" ]; then families="$families $family"; else echo "note: no $family fixture yet"; fi
done
prompt=$(ids llama prompt_ids)
models=()
for family in $families; do
    # one prompt for all: every fixture tokenized the same sentence with the same tokenizer.json
    [ "$(ids "$family" prompt_ids)" = "$prompt" ] || { echo "FAIL: $family has another prompt"; exit 1; }
    rm -f "$WORK/$family.gguf.llama.txt"
    "$EMBER" convert "$HF/$family" -o "$WORK/$family.gguf" --type f32 >/dev/null || { echo "FAIL: convert $family"; exit 1; }
    models+=("$WORK/$family.gguf")
done
# one node process for all models: starting llama.cpp is the slow part
node "$HERE/../peer/llamacpp_greedy.mjs" "$JS/node_modules" 16 "$prompt" "${models[@]}" 2>"$WORK/llama.err" ||
    { cat "$WORK/llama.err"; echo "FAIL: llama.cpp"; exit 1; }
for family in $families; do
    got=$(cut -d' ' -f1 "$WORK/$family.gguf.llama.txt" | tr '\n' ' ' | sed 's/ *$//')
    want=$(ids "$family" greedy_ids)
    if [ "$got" = "$want" ]; then
        echo "$family: llama.cpp reproduces transformers' 16 greedy tokens"
    else
        echo "FAIL: $family: llama.cpp '$got', transformers '$want'"
        status=1
    fi
done
exit $status
