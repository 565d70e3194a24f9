#!/usr/bin/env bash
# The Responses API and Ollama's API with real clients: the official `openai` package's
# responses.create, the Vercel AI SDK's OpenAI provider (Responses by default), the `ollama` package
# and LangChain's ChatOllama (tests/js/responses_client.mjs, ai_sdk_client.mjs, ollama_client.mjs,
# langchain_ollama.mjs, pinned, installed by npm into BUILD/js-apis) against `ember serve` on the
# project's own model (models/), whose answers make the comparisons with chat completions mean
# something; then raw HTTP checks of the framing (SSE event names, NDJSON lines and the last one's
# counts), the second port of --ollama-port, and SIGTERM.
#   bash serve_apis.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 build=$3
here=$(cd "$(dirname "$0")" && pwd)
js=$(cd "$here/../js" && pwd)
model=$(cd "$here/../../models" && pwd)/ember-wordnet-21m.Q4_K_M.gguf
work=$build/js-apis
packages=(openai@6.30.1 ollama@0.6.4 @langchain/ollama@1.3.0 @langchain/core@1.5.0 ai@7.0.185 @ai-sdk/openai@4.0.126)
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/deps.sh --with-node installs them)"
installed() { # name version
  [ -f "$work/node_modules/$1/package.json" ] && grep -q "\"version\": \"$2\"" "$work/node_modules/$1/package.json"
}
if ! installed openai 6.30.1 || ! installed ollama 0.6.4 || ! installed @langchain/ollama 1.3.0 ||
  ! installed @langchain/core 1.5.0 || ! installed ai 7.0.185 || ! installed @ai-sdk/openai 4.0.126; then
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error "${packages[@]}" >"$work/npm.log" 2>&1 ||
    fail "npm install ${packages[*]}: $(tail -20 "$work/npm.log")"
fi
cp "$js"/*.mjs "$work"/

log=$work/serve.log
. "$here/../../tools/serve_lib.sh"
# a free port for --ollama-port (11434 itself may be taken by an Ollama on this machine)
second=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_server "$log" "$ember" serve -m "$model" --port 0 --ollama-port "$second" --api-key sk-ember --ctx 1024 \
  --kv-sequences 8 --device cpu || fail "ember serve did not start"
id=ember-wordnet-21m.Q4_K_M
status=0
for script in responses_client ai_sdk_client ollama_client langchain_ollama; do
  echo "== $script"
  node "$work/$script.mjs" "$url" "$id" sk-ember || status=1
done

# The framing as bytes: SSE events named by their type, NDJSON lines with Ollama's content type.
echo "== raw framing"
auth=(-H 'Authorization: Bearer sk-ember' -H 'content-type: application/json')
sse=$(curl -s "${auth[@]}" "$url/responses" -d "{\"model\":\"x\",\"input\":\"Hello\",\"max_output_tokens\":4,\"stream\":true}")
first=$(printf '%s\n' "$sse" | head -2)
case $first in "event: response.created"*'data: {"type":"response.created","sequence_number":0,'*) ;;
  *) echo "FAIL: /responses stream starts with: $first"; status=1 ;; esac
[ "$(printf '%s\n' "$sse" | grep -c '^event: ')" = "$(printf '%s\n' "$sse" | grep -c '^data: ')" ] ||
  { echo "FAIL: SSE events without their data lines"; status=1; }
headers=$(curl -s -D - -o "$work/ndjson.out" "${auth[@]}" "$url/api/generate" -d '{"model":"x","prompt":"Hello","options":{"num_predict":3,"temperature":0}}')
case $headers in *"application/x-ndjson"*) ;; *) echo "FAIL: /api/generate stream headers: $headers"; status=1 ;; esac
# one object per line, each line ended; the last alone done, with the three tokens asked for and
# Ollama's counts and nanosecond durations as integers
node -e 'const text = require("fs").readFileSync(process.argv[1], "utf8");
  const lines = text.split("\n").slice(0, -1).map(JSON.parse), last = lines.at(-1);
  const fail = (why) => { console.log("FAIL: NDJSON:", why, text); process.exit(1); };
  if (!text.endsWith("\n") || lines.length < 2) fail("no lines");
  if (!last.done || lines.slice(0, -1).some((l) => l.done)) fail("done not on the last line alone");
  if (last.done_reason !== "length" || last.eval_count !== 3 || lines.slice(0, -1).map((l) => l.response).join("") === "") fail("not three tokens");
  for (const k of ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"])
    if (!Number.isInteger(last[k]) || last[k] < 0) fail(k);
  if (!(last.prompt_eval_count > 0 && last.eval_duration > 0 && last.total_duration >= last.eval_duration)) fail("counts");' \
  "$work/ndjson.out" || status=1
# the second port serves the same APIs, with the same key
[ "$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" "http://127.0.0.1:$second/api/tags")" = 200 ] &&
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$second/api/tags")" = 401 ] ||
  { echo "FAIL: --ollama-port $second does not serve /api/tags behind the key"; status=1; }
grep -q "^ember serve: also listening on http://127.0.0.1:$second " "$log" ||
  { echo "FAIL: no line for the second port: $(head -5 "$log")"; status=1; }
# Bad input never takes the server down: it still answers afterwards.
curl -s "${auth[@]}" "$url/v1/responses" -d '{"model":"x","input":[{"type":"function_call"}]}' | grep -q '"param":"input\[0\]"' ||
  { echo "FAIL: a function_call without fields is not a 400 naming input[0]"; status=1; }
curl -s "${auth[@]}" "$url/api/chat" -d '{"model":"x","messages":"no"}' | grep -q '^{"error":"messages: must be an array"}$' ||
  { echo "FAIL: /api/chat with messages not an array"; status=1; }
curl -sf "$url/health" >/dev/null || { echo "FAIL: the server stopped answering"; status=1; }

kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; echo "FAIL: ember serve did not stop within 10 s of SIGTERM"; status=1; }
wait "$pid"
rc=$?
trap - EXIT
[ $rc -eq 0 ] || { echo "FAIL: ember serve exited $rc after SIGTERM"; status=1; }
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$log"; then
  echo "FAIL: sanitizer report in the server log:"; grep -A20 "ERROR\|runtime error" "$log" | head -40; status=1
fi
exit $status
