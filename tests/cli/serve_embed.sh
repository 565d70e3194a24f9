#!/usr/bin/env bash
# Embeddings of `ember serve`:
#  - real clients (tests/js/embed_clients.mjs: the `openai`, `ollama`, @langchain/ollama and
#    @langchain/openai packages, pinned, installed by npm into BUILD/js-embed) against the project's
#    model served with --pooling mean --matryoshka;
#  - the vectors against llama.cpp's (tests/peer/llamacpp_embed.mjs, node-llama-cpp 3.21.1 in
#    BUILD/js) on the same GGUF with the same pooling, with steps of 64 tokens so that the long text
#    is pooled across chunks: cosine >= 0.9999 for tiny qwen3 files that name their pooling (mean,
#    cls, last: read from the file, no flag) and for the project's trained model at F32 with
#    --pooling last (llama.cpp takes the last token's state of a file that names none); >= 0.999 for
#    that model as shipped (Q4_K_M), where each side rounds the activations to 8 bits for its own
#    K-quant products, in its own order (observed: 0.9996 and up);
#  - a model without pooling refuses /v1/embeddings with a 400 that says so.
#   bash serve_embed.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
js=$(cd "$here/../js" && pwd)
project=$(cd "$here/../../models" && pwd)/ember-wordnet-21m.Q4_K_M.gguf
work=$build/js-embed
packages=(openai@6.30.1 ollama@0.6.4 @langchain/ollama@1.3.0 @langchain/core@1.5.0 @langchain/openai@1.6.0)
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/deps.sh --with-node installs them)"
installed() { # name version
  [ -f "$work/node_modules/$1/package.json" ] && grep -q "\"version\": \"$2\"" "$work/node_modules/$1/package.json"
}
if ! installed openai 6.30.1 || ! installed ollama 0.6.4 || ! installed @langchain/ollama 1.3.0 ||
  ! installed @langchain/core 1.5.0 || ! installed @langchain/openai 1.6.0; then
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error "${packages[@]}" >"$work/npm.log" 2>&1 ||
    fail "npm install ${packages[*]}: $(tail -20 "$work/npm.log")"
fi
cp "$js"/*.mjs "$work"/
. "$here/../../tools/llamacpp_lib.sh"
need_llamacpp "$build/js" "$work/llama-npm.log" || exit 1
. "$here/../../tools/serve_lib.sh"

stop_server() {
  kill -TERM "$pid"
  wait "$pid"
  trap - EXIT
}
status=0 servers=0

echo "== clients"
start_server "$work/serve-$((++servers)).log" "$ember" serve -m "$project" --port 0 --api-key sk-ember --ctx 256 --device cpu \
  --pooling mean --matryoshka || fail "ember serve did not start"
node "$work/embed_clients.mjs" "$url" ember-wordnet-21m.Q4_K_M sk-ember || status=1
stop_server

echo "== llama.cpp"
texts=("hello" "The river ran quietly past the old mill, where a miller once ground wheat."
  "$(printf 'bank river money stone water tree %.0s' $(seq 25))")
for pooling in mean cls last; do
  model=$work/tiny-qwen3-$pooling.gguf
  "$ember" synth --preset tiny-qwen3 --type f32 --seed 5 --pooling $pooling -o "$model" \
    --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" || fail "synth tiny-qwen3 --pooling $pooling"
  start_server "$work/serve-$((++servers)).log" "$ember" serve -m "$model" --port 0 --device cpu --batch-tokens 64 ||
    fail "ember serve $model did not start"
  node "$here/../peer/llamacpp_embed.mjs" "$build/js/node_modules" "$url" 0.9999 "$model" "${texts[@]}" || status=1
  stop_server
done
"$ember" quantize "$project" "$work/project-f32.gguf" F32 --allow-requantize >/dev/null || fail "ember quantize F32"
for model in "$work/project-f32.gguf:0.9999" "$project:0.999"; do
  start_server "$work/serve-$((++servers)).log" "$ember" serve -m "${model%:*}" --port 0 --device cpu --batch-tokens 64 \
    --pooling last || fail "ember serve did not start"
  node "$here/../peer/llamacpp_embed.mjs" "$build/js/node_modules" "$url" "${model##*:}" "${model%:*}" "${texts[@]}" || status=1
  stop_server
done

echo "== no pooling"
start_server "$work/serve-$((++servers)).log" "$ember" serve -m "$project" --port 0 --device cpu || fail "ember serve did not start"
answer=$(curl -s "$url/v1/embeddings" -d '{"input":"river"}')
case $answer in *"does not embed: its file names no pooling"*'"param":"model"'*) ;;
  *) echo "FAIL: /v1/embeddings without pooling: $answer"; status=1 ;; esac
curl -sf "$url/health" >/dev/null || { echo "FAIL: the server stopped answering"; status=1; }
stop_server
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$work"/serve-*.log; then
  echo "FAIL: sanitizer report in the server log"; status=1
fi
exit $status
