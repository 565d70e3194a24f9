#!/usr/bin/env bash
# JSON Schema → grammar against ajv: bash grammar_schema.sh EMBER_EXE FIXTURES_DIR BUILD_DIR.
# grammar_sample draws random texts under each schema of tests/fixtures/grammar/schemas.json, byte
# by byte and token by token through the token masks of two real vocabularies; ajv (npm, pinned,
# installed into BUILD_DIR/js-grammar) must accept every one of them.
set -u
fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
schemas=$here/../fixtures/grammar/schemas.json
work=$build/js-grammar
fail() { echo "FAIL: $*"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/deps.sh --with-node)"
mkdir -p "$work"
if ! grep -q '"version": "8.20.0"' "$work/node_modules/ajv/package.json" 2>/dev/null ||
   ! grep -q '"version": "3.0.1"' "$work/node_modules/ajv-formats/package.json" 2>/dev/null; then
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error ajv@8.20.0 ajv-formats@3.0.1 \
    >"$work/npm.log" 2>&1 || fail "npm install ajv failed: $(tail -20 "$work/npm.log")"
fi
cp "$here/../js/schema_check.mjs" "$work/"
status=0
for vocab in ggml-vocab-llama-spm.gguf ggml-vocab-gpt-2.gguf; do
  "$build/tests/grammar_sample" "$schemas" "$fixtures/vocab/$vocab" 20 "$work/samples-$vocab.json" ||
    fail "grammar_sample on $vocab"
  echo "== $vocab"
  node "$work/schema_check.mjs" "$schemas" "$work/samples-$vocab.json" || status=1
done
exit $status
