#!/usr/bin/env bash
# The contract of `ember chat-template`: the rendered text on stdout byte for byte and nothing
# else; errors on stderr with exit status 1 and an empty stdout.
# Usage: chat_template.sh EMBER FIXTURES_DIR BUILD_DIR
set -u
ember="$1"
fixtures="$2"
work="$3/chat-template-cli"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_output NAME EXPECTED(printf format) ARGS... : exit 0, stdout exactly EXPECTED, stderr empty.
expect_output() {
  local name="$1" want="$2"
  shift 2
  printf "$want" >want.txt
  "$ember" chat-template "$@" >got.txt 2>err.txt
  local status=$?
  [ $status -eq 0 ] || { fail "$name: exit $status: $(cat err.txt)"; return; }
  cmp -s want.txt got.txt || { fail "$name: stdout differs"; diff <(od -c want.txt) <(od -c got.txt) | head; }
  [ -s err.txt ] && fail "$name: unexpected stderr: $(cat err.txt)"
}

# expect_error NAME PATTERN ARGS... : exit 1, empty stdout, stderr matches PATTERN.
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  "$ember" chat-template "$@" >got.txt 2>err.txt
  local status=$?
  [ $status -eq 1 ] || fail "$name: exit status $status, expected 1"
  [ -s got.txt ] && fail "$name: stdout should be empty, got: $(head -c 200 got.txt)"
  grep -q -- "$pattern" err.txt || fail "$name: stderr lacks '$pattern': $(cat err.txt)"
}

cat >messages.json <<'JSON'
[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
JSON
cat >tools.json <<'JSON'
[{"type": "function", "function": {"name": "now", "parameters": {}}}]
JSON
cat >simple.jinja <<'JINJA'
{{- bos_token }}
{%- for m in messages %}
<{{ m.role }}>{{ m.content }}</{{ m.role }}>
{%- endfor %}
{%- if tools %}
tools={{ tools | tojson }}
{%- endif %}
{%- if add_generation_prompt %}
<assistant>
{%- endif %}
{{- eos_token }}{{ extra | default('') }}
JINJA

# (trim_blocks removes the newline after each %}, as in the reference renderer.)
expect_output "plain render" '<system>Be brief.</system><user>Hi</user>' --template simple.jinja --messages messages.json
expect_output "all options" '<s><system>Be brief.</system><user>Hi</user>tools=[{"type": "function", "function": {"name": "now", "parameters": {}}}]<assistant></s>{"k": [1, true]}' \
  --template simple.jinja --messages messages.json --add-generation-prompt --bos-token '<s>' --eos-token '</s>' \
  --tools tools.json --var 'extra={"k": [1, true]}'
printf 'no newline at the end: {{ messages | length }}' >exact.jinja
expect_output "no trailing newline added" 'no newline at the end: 2' --template exact.jinja --messages messages.json
printf '{{ strftime_now("%%Y-%%m-%%d") }}' >date.jinja
SOURCE_DATE_EPOCH=1767225600 TZ=UTC expect_output "strftime_now honours SOURCE_DATE_EPOCH" '2026-01-01' --template date.jinja --messages messages.json

# From a GGUF file: the template and bos/eos come from the file's metadata.
phi3="$fixtures/vocab/ggml-vocab-phi-3.gguf"
expect_output "-m uses the file's template and bos" '<s><|user|>\nHi<|end|>\n<|assistant|>\n' -m "$phi3" --messages messages.json --add-generation-prompt
expect_output "--bos-token overrides the file's" 'BOS<|user|>\nHi<|end|>\n<|assistant|>\n' -m "$phi3" --messages messages.json --bos-token BOS
expect_error "-m without a chat template" "no chat template" -m "$fixtures/vocab/ggml-vocab-llama-spm.gguf" --messages messages.json

# Errors.
printf 'line one\n{%% for m in messages %%}{{ m.role | nosuch }}{%% endfor %%}' >badfilter.jinja
expect_error "unknown filter names line and column" "line 2, column 36: unknown or unsupported filter 'nosuch'" --template badfilter.jinja --messages messages.json
printf '{%% include "x" %%}' >badstmt.jinja
expect_error "unsupported statement" "line 1, column 1: unknown or unsupported statement 'include'" --template badstmt.jinja --messages messages.json
printf '{{ raise_exception("no system messages") }}' >raise.jinja
expect_error "raise_exception" "raise_exception: no system messages" --template raise.jinja --messages messages.json
expect_error "missing --messages" "messages is required" --template simple.jinja
expect_error "both --template and -m" "exactly one of" --template simple.jinja -m "$phi3" --messages messages.json
expect_error "missing file" "cannot open" --template nosuch.jinja --messages messages.json
printf '{"role": "user"}' >notalist.json
expect_error "messages not a list" "expected a JSON array" --template simple.jinja --messages notalist.json
printf '[{"role": ' >broken.json
expect_error "broken JSON names the position" "line 1, column" --template simple.jinja --messages broken.json
expect_error "bad --var" "NAME=JSON" --template simple.jinja --messages messages.json --var novalue
expect_error "unknown argument" "unexpected argument" --template simple.jinja --messages messages.json --bogus

[ $failures -eq 0 ] && echo "chat-template CLI: all checks passed"
[ $failures -eq 0 ]
