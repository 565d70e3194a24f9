#!/usr/bin/env bash
# Structured output and tool calls through the official npm clients against a real `ember serve`
# on a synthetic tiny model: bash serve_structured.sh EMBER_EXE FIXTURES_DIR BUILD_DIR.
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
js=$(cd "$here/../js" && pwd)
work=$build/js-structured
mkdir -p "$work"
model=$work/tiny-llama.gguf
fail() { echo "FAIL: $*"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/deps.sh --with-node)"
packages=(openai@6.30.1 @anthropic-ai/sdk@1.14.0 ajv@8.20.0 ajv-formats@3.0.1)
for p in "${packages[@]}"; do
  name=${p%@*} version=${p##*@}
  grep -q "\"version\": \"$version\"" "$work/node_modules/$name/package.json" 2>/dev/null && continue
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error "${packages[@]}" >"$work/npm.log" 2>&1 ||
    fail "npm install failed: $(tail -20 "$work/npm.log")"
  break
done
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" -o "$model" >"$work/synth.log" 2>&1 ||
  fail "ember synth: $(tail -5 "$work/synth.log")"
log=$work/serve.log
. "$here/../../tools/serve_lib.sh"
start_server "$log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 1024 --device cpu || fail "ember serve did not start"
cp "$js"/*.mjs "$work"/
status=0
for script in structured_client tools_client; do
  echo "== $script"
  node "$work/$script.mjs" "$url" tiny-llama sk-ember || status=1
done
kill -TERM "$pid"; wait "$pid"; rc=$?; trap - EXIT
[ $rc -eq 0 ] || { echo "FAIL: ember serve exited $rc after SIGTERM"; status=1; }
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$log"; then
  echo "FAIL: sanitizer report in the server log:"; grep -A20 "ERROR\|runtime error" "$log" | head -40; status=1
fi
exit $status
