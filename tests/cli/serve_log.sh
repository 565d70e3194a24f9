#!/usr/bin/env bash
# What `ember serve` tells its operator, on a converted transformers checkpoint
# (tests/fixtures/hf/mistral):
#  - the start-up summary: the model's parameter count (summed from the checkpoint's safetensors
#    header), quantization, family, device, threads, context, KV cache and its room in tokens, the
#    URLs; a warning when --ctx exceeds the checkpoint's max_position_embeddings;
#  - an access log line per request on stderr, text and JSON, with the status curl saw (200, 400,
#    404), the path and the token counts; --quiet silences it;
#  - EMBER_MODEL, EMBER_PORT, EMBER_CTX, EMBER_HOST as defaults that flags override;
#  - a busy port refused before the model is read.
# usage: serve_log.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 build=$3
here=$(cd "$(dirname "$0")" && pwd)
hf=$here/../fixtures/hf/mistral
work=$build/cli_serve_log
mkdir -p "$work"
status=0
fail() { echo "FAIL: $*"; status=1; }
has() { case $1 in *"$2"*) return 0 ;; esac; return 1; }

"$ember" convert "$hf" -o "$work/mistral.gguf" --type f32 >/dev/null 2>&1 || { echo "FAIL: convert"; exit 1; }
. "$here/../../tools/serve_lib.sh"

# The references: the checkpoint's own parameter count and training context.
parameters=$(python3 -c "
import json, math, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n)); count = sum(math.prod(v['shape']) for k, v in h.items() if k != '__metadata__')
print('%.1fK' % (count / 1e3) if count < 1e6 else '%.1fM' % (count / 1e6))" "$hf/model.safetensors")
trained=$(tr -d ' \n' <"$hf/config.json" | sed -e 's/.*"max_position_embeddings":\([0-9]*\).*/\1/')

# stop_server: SIGTERM, and wait for the log to be complete
stop_server() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
post() { curl -s -o /dev/null -w '%{http_code}' "$url$1" -H 'content-type: application/json' -d "$2"; }
chat='{"model":"x","max_tokens":3,"temperature":0,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}'

# ---- Text log, the summary, the context warning (EMBER_CTX longer than the training context) ----
log=$work/text.log
EMBER_CTX=$((trained * 2)) start_server "$log" "$ember" serve -m "$work/mistral.gguf" --port 0 --device cpu \
  --threads 2 --kv-sequences 2 || { echo "FAIL: ember serve did not start"; exit 1; }
port=${url##*:}
[ "$(post /v1/chat/completions "$chat")" = 200 ] || fail "a chat request"
[ "$(post /v1/chat/completions '{"model":')" = 400 ] || fail "a malformed body"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/no/such/path")" = 404 ] || fail "an unknown path"
# a path that decodes to a quote and a newline: escaped, still one line
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/a%22b%0Ac")" = 404 ] || fail "a path with a quote and a newline"
stop_server
out=$(cat "$log")
has "$out" "model $work/mistral.gguf: " || fail "summary: the model's file: $out"
has "$out" ", llama, $parameters parameters, F32 " || fail "summary: family, $parameters parameters, F32: $out"
has "$out" "device cpu, 2 threads" || fail "summary: device and threads: $out"
ctx=$((trained * 2))
has "$out" "context $ctx tokens; KV cache " && has "$out" "room for $((ctx * 2)) tokens (2.0 full contexts)" ||
  fail "summary: context $ctx from EMBER_CTX, room for two of it: $out"
has "$out" "chat page http://127.0.0.1:$port/, APIs http://127.0.0.1:$port/v1" || fail "summary: the URLs: $out"
has "$out" "warning: the context ($ctx tokens) is longer than the $trained tokens the model was trained for" &&
  has "$out" "RoPE is scaled by 2.00x" || fail "the context warning: $out"
grep -Eq '^[0-9-]{10}T[0-9:.]{12}Z 127\.0\.0\.1 "POST /v1/chat/completions" 200 prompt=[1-9][0-9]* completion=3 [0-9.]+ms$' "$log" ||
  fail "text log: the chat request: $out"
grep -Eq '"POST /v1/chat/completions" 400 [0-9.]+ms$' "$log" || fail "text log: the 400: $out"
grep -Eq '"GET /no/such/path" 404 [0-9.]+ms$' "$log" || fail "text log: the 404: $out"
grep -Fq '"GET /a\x22b\x0ac" 404 ' "$log" || fail "text log: a quote and a newline escaped: $out"
[ "$(grep -c '^[0-9-]\{10\}T' "$log")" = 4 ] || fail "text log: one line per request: $out"

# ---- JSON log; --ctx overrides EMBER_CTX, --port overrides EMBER_PORT; EMBER_MODEL ----
log=$work/json.log
EMBER_MODEL=$work/mistral.gguf EMBER_CTX=100000 EMBER_PORT=1 start_server "$log" "$ember" serve --port 0 --ctx 64 \
  --device cpu --threads 2 --log-format json || { echo "FAIL: ember serve (EMBER_MODEL) did not start"; exit 1; }
[ "$(post /v1/chat/completions "$chat")" = 200 ] || fail "json: a chat request"
[ "$(post /v1/chat/completions '[]')" = 400 ] || fail "json: a body that is not an object"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/nope")" = 404 ] || fail "json: an unknown path"
stop_server
out=$(cat "$log")
has "$out" "context 64 tokens" || fail "--ctx over EMBER_CTX: $out"
has "$out" "warning:" && fail "a context within the training length warns: $out"
has "$out" '"client":"127.0.0.1","method":"POST","path":"/v1/chat/completions","status":200,"prompt_tokens":' &&
  has "$out" '"completion_tokens":3,"duration_ms":' || fail "json log: the chat request: $out"
has "$out" '"path":"/v1/chat/completions","status":400,"prompt_tokens":null,"completion_tokens":null' ||
  fail "json log: the 400: $out"
has "$out" '"method":"GET","path":"/nope","status":404,' || fail "json log: the 404: $out"

# ---- --quiet: the summary stays, the access log goes ----
log=$work/quiet.log
start_server "$log" "$ember" serve -m "$work/mistral.gguf" --port 0 --ctx 64 --device cpu --threads 2 --quiet ||
  { echo "FAIL: ember serve --quiet did not start"; exit 1; }
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] || fail "--quiet: /health"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/nope")" = 404 ] || fail "--quiet: an unknown path"
busy=${url##*:}
# ---- A busy port: refused before the model is read (the model named does not even exist) ----
out=$("$ember" serve -m "$work/absent.gguf" --port "$busy" 2>&1)
[ $? = 1 ] && has "$out" "cannot listen on 127.0.0.1:$busy" && ! has "$out" absent.gguf ||
  fail "a busy --port: $out"
out=$("$ember" serve -m "$work/absent.gguf" --port 0 --ollama-port "$busy" 2>&1)
[ $? = 1 ] && has "$out" "cannot listen on 127.0.0.1:$busy" || fail "a busy --ollama-port: $out"
out=$(EMBER_PORT=$busy EMBER_HOST=127.0.0.1 "$ember" serve -m "$work/absent.gguf" 2>&1)
[ $? = 1 ] && has "$out" "cannot listen on 127.0.0.1:$busy" || fail "a busy EMBER_PORT: $out"
out=$(EMBER_PORT=http "$ember" serve -m "$work/absent.gguf" 2>&1)
[ $? = 1 ] && has "$out" "EMBER_PORT='http' is not a number" || fail "a bad EMBER_PORT: $out"
out=$("$ember" serve -m "$work/absent.gguf" --log-format xml 2>&1)
[ $? = 1 ] && has "$out" "bad value for --log-format: 'xml'" || fail "--log-format xml: $out"
stop_server
out=$(cat "$log")
has "$out" "listening on" || fail "--quiet: the ready line: $out"
has "$out" '"GET /' && fail "--quiet logged a request: $out"
has "$out" "device cpu, 2 threads" || fail "--quiet: the summary stays: $out"

[ $status = 0 ] && echo "serve_log: ok"
exit $status
