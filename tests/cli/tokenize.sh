#!/usr/bin/env bash
# `ember tokenize`: the exact output format scripts depend on, --raw, -f, --decode, and clean
# failures. Expected ids come from llama.cpp's conformance fixtures (.out files).
set -u
ember=$1 fixtures=$2 build=$3
status=0
fail() { echo "FAIL: $*"; status=1; }
vocab=$fixtures/vocab
gpt2=$vocab/ggml-vocab-gpt-2.gguf
spm=$vocab/ggml-vocab-llama-spm.gguf

# --ids: one line, single spaces, a newline at the end and nothing else.
out=$("$ember" tokenize -m "$gpt2" --raw --ids "Hello world" | od -An -c | tr -s ' ')
[ "$out" = " 1 5 4 9 6 9 9 5 \n" ] || fail "--ids format: '$out'"

# Every fixture case through the command line equals the fixture (raw = the fixtures' convention).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in llama-spm gpt-2 deepseek-coder bert-bge; do
  awk -v out="$tmp/$name" 'BEGIN { RS = "\n__ggml_vocab_test__\n" }
    { f = out "." (NR - 1); printf "%s", $0 > f; close(f) }' "$vocab/ggml-vocab-$name.gguf.inp"
  i=0
  while IFS= read -r expected; do
    got=$("$ember" tokenize -m "$vocab/ggml-vocab-$name.gguf" --raw --ids -f "$tmp/$name.$i") || fail "$name case $i exited $?"
    [ "$got" = "$(echo $expected)" ] || fail "$name case $i: expected '$expected', got '$got'"
    i=$((i + 1))
  done <"$vocab/ggml-vocab-$name.gguf.out"
  [ $i -ge 40 ] || fail "$name: only $i cases"
done

# Without --ids: id, a tab, the token's bytes (escaped), one token per line.
out=$("$ember" tokenize -m "$gpt2" --raw "Hello world")
[ "$out" = "$(printf '15496\tHello\n995\t world')" ] || fail "per-token lines: '$out'"
out=$("$ember" tokenize -m "$gpt2" --raw $'a\nb')
[ "$out" = "$(printf '64\ta\n198\t\\n\n65\tb')" ] || fail "escaped newline: '$out'"

# Without --raw: BOS as the vocabulary asks, and special-token text parsed.
out=$("$ember" tokenize -m "$spm" --ids "Hello")
[ "$out" = "1 15043" ] || fail "llama-spm with BOS: '$out'"
out=$("$ember" tokenize -m "$gpt2" --ids "a<|endoftext|>")
[ "$out" = "64 50256" ] || fail "parse special: '$out'"
out=$("$ember" tokenize -m "$gpt2" --raw --ids "a<|endoftext|>")
[ "$out" = "64 27 91 437 1659 5239 91 29" ] || fail "raw special text: '$out'"

# --decode prints the text (and a newline).
out=$("$ember" tokenize -m "$gpt2" --decode 15496 995 | od -An -c | tr -s ' ')
[ "$out" = " H e l l o w o r l d \n" ] || fail "--decode: '$out'"
out=$("$ember" tokenize -m "$spm" --decode 1 15043 3186)
[ "$out" = "<s>Hello world" ] || fail "--decode spm: '$out'"
out=$("$ember" tokenize -m "$spm" --raw --decode 1 15043 3186)
[ "$out" = "Hello world" ] || fail "--raw --decode spm: '$out'"
out=$("$ember" tokenize -m "$gpt2" --decode 64 50256)
[ "$out" = "a<|endoftext|>" ] || fail "--decode control: '$out'"
out=$("$ember" tokenize -m "$gpt2" --raw --decode 64 50256)
[ "$out" = "a" ] || fail "--raw --decode control: '$out'"

# Failures: exit 1 and a message that says what is wrong.
printf 'ok \xC3\x28' >"$tmp/bad.txt"
err=$("$ember" tokenize -m "$gpt2" -f "$tmp/bad.txt" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "invalid UTF-8 at byte 3" <<<"$err" || fail "invalid UTF-8: exit $rc, $err"
err=$("$ember" tokenize -m "$fixtures/quant-reference.gguf" hi 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "no tokenizer" <<<"$err" || fail "no tokenizer: exit $rc, $err"
err=$("$ember" tokenize -m "$gpt2" --decode 99999999 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "not a token id" <<<"$err" || fail "bad id: exit $rc, $err"
err=$("$ember" tokenize "hello" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "usage" <<<"$err" || fail "no model: exit $rc, $err"
err=$("$ember" tokenize -m "$tmp/missing.gguf" hi 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] || fail "missing model: exit $rc"
exit $status
