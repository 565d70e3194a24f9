#!/usr/bin/env bash
# Tool calls through real models' chat templates, with the call marker as one control token:
#   bash tool_templates.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
# The templates are llama.cpp's copies of the models' own (models/templates in the llama.cpp source
# that the node-llama-cpp package ships as a git bundle): Mistral Nemo (`[TOOL_CALLS][{...}]`),
# Devstral (`[TOOL_CALLS]name[ARGS]{...}`), Qwen 2.5 and Hermes 3 (`<tool_call>`), Llama 3.1
# (`{"name", "parameters"}`). For each one:
#   1. Ember renders a conversation with tools, a call and its result exactly as the reference
#      renderer (@huggingface/jinja) does;
#   2. a tiny random model (tiny-llama, the reference fixtures' llama-spm vocabulary) gets the
#      template, and the markers become control tokens of its vocabulary, as they are in the real
#      models' vocabularies; `ember serve` runs it; pushed towards the marker token (logit_bias),
#      the model writes it, and the answer must come back as a call of the right tool with valid
#      arguments, under tool_choice auto (the lazy grammar switched on by the control token) and
#      required (the whole answer constrained), and a second turn with the tool's result must render.
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$build/tool-templates
js=$build/js
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
. "$here/../../tools/llamacpp_lib.sh"
need_llamacpp "$js" "$work/npm.log" || exit 1
grep -qs '"version": "0.5.11"' "$js/node_modules/@huggingface/jinja/package.json" ||
  npm install --prefix "$js" --no-audit --no-fund --no-save --loglevel=error @huggingface/jinja@0.5.11 >"$work/npm.log" 2>&1 ||
  fail "npm install @huggingface/jinja: $(tail -5 "$work/npm.log")"
bundle=$js/node_modules/node-llama-cpp/llama/gitRelease.bundle
[ -f "$bundle" ] || fail "node-llama-cpp has no llama.cpp source bundle at $bundle"
src=$work/llama.git
[ -d "$src" ] || git clone -q --bare "$bundle" "$src" 2>"$work/git.log" || fail "git clone of the bundle: $(cat "$work/git.log")"
edit=$build/tests/gguf_edit
[ -x "$edit" ] || fail "$edit is not built"

# name, llama.cpp template file, markers (token id=text; ids of rarely used pieces of llama-spm)
cases=(
  "mistral-nemo mistralai-Mistral-Nemo-Instruct-2407 31990=[TOOL_CALLS] 31991=[ARGS]"
  "devstral unsloth-mistral-Devstral-Small-2507 31990=[TOOL_CALLS] 31991=[ARGS]"
  "qwen2.5 Qwen-Qwen2.5-7B-Instruct 31993=<tool_call> 31994=</tool_call>"
  "hermes3 NousResearch-Hermes-3-Llama-3.1-8B-tool_use 31993=<tool_call> 31994=</tool_call>"
  "llama3.1 meta-llama-Llama-3.1-8B-Instruct 31992=<|python_tag|>"
)

base=$work/tiny-llama.gguf
[ -s "$base" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" -o "$base" \
  >"$work/synth.log" 2>&1 || fail "ember synth: $(tail -5 "$work/synth.log")"

# 1. Rendering, against the reference.
cat >"$work/conversation.json" <<'JSON'
{"messages": [
  {"role": "system", "content": "You forecast weather."},
  {"role": "user", "content": "What will the weather be in Oslo?"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "abc123456", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}]},
  {"role": "tool", "tool_call_id": "abc123456", "name": "get_weather", "content": "{\"forecast\": \"sunny\"}"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                  "days": {"type": "integer", "description": "How many days"}}, "required": ["city", "days"]}}}],
 "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"}
JSON
status=0
cases_json="{\"templates\": {"
pairs=""
for c in "${cases[@]}"; do
  set -- $c
  git --git-dir "$src" show "HEAD:models/templates/$2.jinja" >"$work/$1.jinja" 2>/dev/null || fail "no template $2 in the bundle"
  cases_json+="\"$1\": {\"file\": \"$work/$1.jinja\"},"
  pairs+="[\"$1\", \"tools\"],"
done
printf '%s}, "conversations": {"tools": %s}, "pairs": [%s]}\n' "${cases_json%,}" "$(cat "$work/conversation.json")" \
  "${pairs%,}" >"$work/cases.json"
rm -rf "$work/rendered"
mkdir -p "$work/rendered"
TZ=UTC SOURCE_DATE_EPOCH=1767225600 node "$here/../js/render_reference.mjs" "$js/node_modules" "$work/cases.json" \
  "$work/rendered" "$fixtures" || fail "reference renderer"
for dir in "$work"/rendered/*/; do
  name=$(basename "$dir")
  [ -f "$dir/expected.txt" ] || { echo "FAIL $name: the reference did not render it: $(cat "$dir/expected.err" 2>/dev/null)"; status=1; continue; }
  mapfile -t args <"$dir/args"
  if (cd "$dir" && TZ=UTC SOURCE_DATE_EPOCH=1767225600 "$ember" chat-template "${args[@]}" >actual.txt 2>actual.err) &&
    cmp -s "$dir/expected.txt" "$dir/actual.txt"; then
    echo "ok   render $name ($(wc -c <"$dir/expected.txt") bytes identical)"
  else
    echo "FAIL render $name: $(head -c 300 "$dir/actual.err")"
    diff "$dir/expected.txt" "$dir/actual.txt" | head -10
    status=1
  fi
done

# 2. Serving, with the markers as control tokens.
. "$here/../../tools/serve_lib.sh"
cp "$here"/../js/*.mjs "$js"/
for c in "${cases[@]}"; do
  set -- $c
  name=$1
  shift 2
  controls=()
  for m in "$@"; do controls+=(--control "$m"); done
  model=$work/$name.gguf
  "$edit" "$base" "$model" --template "$work/$name.jinja" "${controls[@]}" || fail "gguf_edit $name"
  marker=${1%%=*}
  [ "$name" = llama3.1 ] && marker=-1 # its calls are plain JSON; <|python_tag|> is for built-in tools
  start_server "$work/serve-$name.log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 2048 --device cpu ||
    fail "ember serve ($name) did not start"
  for choice in auto required; do
    [ "$name" = llama3.1 ] && [ $choice = auto ] && continue # nothing to push: a random model writes no JSON
    echo "== $name, tool_choice $choice"
    node "$js/tool_templates.mjs" "$url" "$name" sk-ember "$marker" $choice || status=1
  done
  kill -TERM "$pid"; wait "$pid"; rc=$?; trap - EXIT
  [ $rc -eq 0 ] || { echo "FAIL: ember serve ($name) exited $rc after SIGTERM"; status=1; }
  if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$work/serve-$name.log"; then
    echo "FAIL: sanitizer report in the server log ($name)"; status=1
  fi
done
[ $status -eq 0 ] && echo "tool templates: all passed"
exit $status
