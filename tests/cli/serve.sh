#!/usr/bin/env bash
# `ember serve` on a converted transformers checkpoint (tests/fixtures/hf/mistral, whose greedy
# continuation of its reference prompt starts with <|eos|>), with plain curl:
#  - --alias NAME is the id /v1/models lists and every response reports; /v1/models/{id} answers
#    for that id only;
#  - a request naming another model (an agent client's own name) is served by this one;
#  - ignore_eos (llama-server's request field) runs past <|eos|> to max_tokens;
#  - an empty API key is refused at start.
# usage: serve.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 build=$3
here=$(cd "$(dirname "$0")" && pwd)
hf=$here/../fixtures/hf
work=$build/cli_serve
mkdir -p "$work"
status=0
fail() { echo "FAIL: $*"; status=1; }
# has JSON TEXT: the compact JSON holds TEXT
has() { case $1 in *"$2"*) return 0 ;; esac; return 1; }

# An empty key would serve without one: refused at start, from the flag or the environment.
out=$("$ember" serve -m "$work/none.gguf" --api-key "" 2>&1)
[ $? = 1 ] && has "$out" "--api-key is empty" || fail "an empty --api-key: $out"
out=$(EMBER_API_KEY= "$ember" serve -m "$work/none.gguf" 2>&1)
[ $? = 1 ] && has "$out" "EMBER_API_KEY is empty" || fail "an empty EMBER_API_KEY: $out"

"$ember" convert "$hf/mistral" -o "$work/mistral.gguf" --type f32 >/dev/null 2>&1 || { echo "FAIL: convert"; exit 1; }
. "$here/../../tools/serve_lib.sh"
start_server "$work/serve.log" "$ember" serve -m "$work/mistral.gguf" --port 0 --alias my-model --device cpu \
  --threads 2 --ctx 128 --kv-sequences 2 || { echo "FAIL: ember serve did not start"; exit 1; }

out=$(curl -s "$url/v1/models")
has "$out" '"data":[{"id":"my-model",' || fail "/v1/models with --alias: $out"
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/models/my-model")
[ "$code" = 200 ] || fail "/v1/models/my-model: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/models/mistral")
[ "$code" = 404 ] || fail "/v1/models/mistral (the file's name, not the alias): $code"

# An Anthropic client's own model name: answered by this model, which reports its id.
out=$(curl -s "$url/v1/messages" -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' \
  -d '{"model":"claude-sonnet-4-5","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}')
has "$out" '"type":"message"' && has "$out" '"model":"my-model"' || fail "Anthropic request for claude-sonnet-4-5: $out"
out=$(curl -s "$url/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}')
has "$out" '"object":"chat.completion"' && has "$out" '"model":"my-model"' || fail "OpenAI request for gpt-4o: $out"

# transformers' greedy continuation of this prompt starts with <|eos|> (id 1): it stops there,
# unless ignore_eos, which runs to max_tokens.
prompt=$(tr -d ' \n' <"$hf/mistral/expected.json" | sed -e 's/.*"prompt_ids":\(\[[0-9,]*\]\).*/\1/')
complete() { curl -s "$url/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\":\"x\",\"prompt\":$prompt,\"max_tokens\":16,\"temperature\":0$1}"; }
out=$(complete "")
has "$out" '"finish_reason":"stop"' && has "$out" '"completion_tokens":1,' || fail "stop at <|eos|>: $out"
out=$(complete ',"ignore_eos":true')
has "$out" '"finish_reason":"length"' && has "$out" '"completion_tokens":16,' || fail "ignore_eos: $out"
# The same through the chat API, <|eos|> forced by a logit bias.
chat() { curl -s "$url/v1/chat/completions" -H 'content-type: application/json' \
  -d "{\"model\":\"x\",\"max_tokens\":5,\"logit_bias\":{\"1\":100},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]$1}"; }
out=$(chat "")
has "$out" '"finish_reason":"stop"' && has "$out" '"completion_tokens":1,' || fail "chat, <|eos|> forced: $out"
out=$(chat ',"ignore_eos":true')
has "$out" '"finish_reason":"length"' && has "$out" '"completion_tokens":5,' && has "$out" '"content":""' ||
  fail "chat, <|eos|> forced, ignore_eos: $out"

# Stopped cleanly, and (on a sanitizer build) nothing reported along the way.
kill -TERM "$pid"
wait "$pid" || fail "ember serve exited $? after SIGTERM"
trap - EXIT
grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$work/serve.log" &&
  fail "sanitizer report in the server log: $(grep -A10 "ERROR\|runtime error" "$work/serve.log" | head -20)"
exit $status
