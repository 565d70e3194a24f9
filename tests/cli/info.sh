#!/usr/bin/env bash
# `ember info`: works on every shared fixture (text and JSON), and fails cleanly on bad files.
set -u
ember=$1 fixtures=$2 build=$3
status=0
fail() { echo "FAIL: $*"; status=1; }

for f in "$fixtures"/quant-reference.gguf "$fixtures"/vocab/*.gguf; do
  out=$("$ember" info "$f") || fail "info $f exited $?"
  grep -q "^tensors:" <<<"$out" || fail "info $f: no tensor line"
  json=$("$ember" info --json "$f") || fail "info --json $f exited $?"
  grep -q '"bytes_per_token"' <<<"$json" || fail "info --json $f: no bytes_per_token"
done

out=$("$ember" info "$fixtures/vocab/ggml-vocab-llama-spm.gguf")
grep -q "tokenizer:       llama, 32000 tokens" <<<"$out" || fail "llama-spm tokenizer line: $out"
grep -q "architecture:    llama" <<<"$out" || fail "llama-spm architecture"
grep -q "^family:          llama: SwiGLU" <<<"$out" || fail "llama-spm family line: $out"
out=$("$ember" info "$fixtures/quant-reference.gguf")
grep -q "tensors:         68" <<<"$out" || fail "quant-reference tensor count"
grep -q "total size:      652864 bytes" <<<"$out" || fail "quant-reference total size"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'GGUF\x03\x00\x00\x00' >"$tmp/short.gguf"
err=$("$ember" info "$tmp/short.gguf" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] || fail "truncated file: exit $rc"
grep -q "short.gguf: offset 8: tensor count: file truncated" <<<"$err" || fail "truncated file message: $err"
echo "not a model" >"$tmp/text.gguf"
err=$("$ember" info "$tmp/text.gguf" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "not a GGUF file" <<<"$err" || fail "text file: exit $rc, $err"
err=$("$ember" info "$tmp/missing.gguf" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "No such file" <<<"$err" || fail "missing file: exit $rc, $err"
err=$("$ember" info 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "usage" <<<"$err" || fail "no argument: exit $rc, $err"
exit $status
