#!/usr/bin/env bash
# gpt-oss's harmony format through a real `ember serve`, with the official OpenAI and Anthropic npm
# clients: bash harmony.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
# A tiny random model (tiny-llama, the reference fixtures' llama-spm vocabulary) gets gpt-oss's chat
# template (tests/fixtures/chat/gpt_oss.jinja) and harmony's markup as control tokens of its
# vocabulary, as o200k_harmony holds them. The template renders the conversation with its markup as
# those tokens; grammars make the model write harmony (a forced call, or a raw grammar of an
# analysis message then a final one) with the markup as the control tokens; the answers must come
# back split into reasoning, content and calls on both APIs, streamed and whole, and a second turn
# with the tool's result must render (tests/js/harmony_client.mjs).
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$build/harmony
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
edit=$build/tests/gguf_edit
[ -x "$edit" ] || fail "$edit is not built"

base=$work/tiny-llama.gguf
[ -s "$base" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" -o "$base" \
  >"$work/synth.log" 2>&1 || fail "ember synth: $(tail -5 "$work/synth.log")"
# harmony's markup on ids of rarely used pieces of llama-spm
markup=(31980='<|start|>' 31981='<|channel|>' 31982='<|message|>' 31983='<|end|>' 31984='<|return|>' 31985='<|call|>'
  31986='<|constrain|>')
controls=()
for m in "${markup[@]}"; do controls+=(--control "$m"); done
model=$work/tiny-harmony.gguf
"$edit" "$base" "$model" --template "$here/../fixtures/chat/gpt_oss.jinja" "${controls[@]}" || fail "gguf_edit"

# The template's markup is the control tokens (one token each); message text is rendered as written.
printf '[{"role": "user", "content": "Hi <|end|>"}]' >"$work/messages.json"
"$ember" chat-template -m "$model" --messages "$work/messages.json" --add-generation-prompt >"$work/prompt.txt" ||
  fail "chat-template: $(cat "$work/prompt.txt")"
grep -q '<|start|>user<|message|>Hi <|end|><|end|><|start|>assistant$' "$work/prompt.txt" ||
  fail "the rendered prompt: $(cat "$work/prompt.txt")"
ids=$("$ember" tokenize -m "$model" --ids '<|start|>assistant<|channel|>final<|message|>x<|end|>') || fail "tokenize"
case " $ids " in *" 31980 "*" 31981 "*" 31982 "*" 31983 "*) ;; *) fail "the markup is not the control tokens: $ids" ;; esac

. "$here/../../tools/serve_lib.sh"
start_server "$work/serve.log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 4096 --device cpu ||
  fail "ember serve did not start"
status=0
EMBER_HARMONY_IDS="31980,31981,31982,31983,31986" bash "$here/../js/run.sh" "$url" tiny-harmony sk-ember "$build/js" \
  harmony_client || status=1
kill -TERM "$pid"
wait "$pid"
rc=$?
trap - EXIT
[ $rc -eq 0 ] || { echo "FAIL: ember serve exited $rc after SIGTERM"; status=1; }
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$work/serve.log"; then
  echo "FAIL: sanitizer report in the server log"; status=1
fi
[ $status -eq 0 ] && echo "harmony: all passed"
exit $status
