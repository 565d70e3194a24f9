#!/usr/bin/env bash
# /tokenize and /detokenize of `ember serve` against llama.cpp's tokenizer (node-llama-cpp 3.21.1,
# installed into BUILD/js as the peer tests do) on the project's model (models/): the ids of every
# text of the tokenizer corpus and of chat markup, with and without control-token text parsed and
# with BOS, each id's piece, and the text of the ids (tests/js/tokenize_peer.mjs).
#   bash serve_tokenize.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 build=$3
here=$(cd "$(dirname "$0")" && pwd)
js=$build/js
work=$build/serve-tokenize
model=$(cd "$here/../../models" && pwd)/ember-wordnet-21m.Q4_K_M.gguf
mkdir -p "$work"
. "$here/../../tools/llamacpp_lib.sh"
need_llamacpp "$js" "$work/npm.log" || exit 1
. "$here/../../tools/serve_lib.sh"
start_server "$work/serve.log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 512 --device cpu ||
  { echo "FAIL: ember serve did not start"; exit 1; }
node "$here/../js/tokenize_peer.mjs" "$url" sk-ember "$model" "$js/node_modules"
