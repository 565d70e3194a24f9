#!/usr/bin/env bash
# `ember convert` from the command line: each transformers checkpoint of tests/fixtures/hf converts,
# and `ember run --prompt-ids ... --temp 0 --print-ids --ignore-eos` reproduces transformers' 16
# greedy tokens (which run through <|eos|> in some families); without --ignore-eos the run stops
# before the first <|eos|>. Bad input fails with exit status 1 and a message.
set -u
ember=$1 build=$3
hf=$(cd "$(dirname "$0")/../fixtures/hf" && pwd)
status=0
fail() { echo "FAIL: $*"; status=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A JSON list of integers from expected.json, as space-separated numbers.
ids() { tr -d ' \n' <"$hf/$1/expected.json" | sed -e "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/" | tr ',' ' '; }

for family in llama mistral mixtral qwen2 qwen3 qwen3moe gemma2 gemma3 gemma3mm gemma3pattern; do
  out=$("$ember" convert "$hf/$family" -o "$tmp/$family.gguf" --type f32) || { fail "convert $family exited $?"; continue; }
  grep -q "^$tmp/$family.gguf: " <<<"$out" || fail "convert $family: output line '$out'"
  want=$(ids "$family" greedy_ids)
  greedy() { "$ember" run -m "$tmp/$family.gguf" --prompt-ids "$(ids "$family" prompt_ids)" -n 16 --temp 0 --print-ids \
             "$@" 2>/dev/null | tr '\n' ' ' | sed 's/ *$//'; }
  # transformers generated its 16 tokens through <|eos|> (id 1): --ignore-eos does too, and without
  # it the run stops before the first <|eos|>.
  got=$(greedy --ignore-eos)
  [ "$got" = "$want" ] || fail "$family greedy --ignore-eos: got '$got', transformers '$want'"
  before_eos=$(sed -e 's/^1$//; s/^1 .*//; s/ 1$//; s/ 1 .*//' <<<"$want")
  got=$(greedy)
  [ "$got" = "$before_eos" ] || fail "$family greedy: got '$got', transformers '$want' up to <|eos|>: '$before_eos'"
done

# The tokenizer half: the fixtures' prompt is the first 24 ids of this sentence as transformers
# tokenized it with the checkpoint's tokenizer.json.
sentence="The river ran quietly past the old mill, and children threw sticks from the bridge"
got=$("$ember" tokenize -m "$tmp/llama.gguf" --raw --ids "$sentence" | cut -d' ' -f1-24)
[ "$got" = "$(ids llama prompt_ids)" ] || fail "tokenize: got '$got', transformers '$(ids llama prompt_ids)'"

out=$("$ember" info "$tmp/llama.gguf") || fail "info on a converted file"
grep -q "architecture:    llama" <<<"$out" || fail "info: $out"

err=$("$ember" convert "$hf/llama" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "required" <<<"$err" || fail "no -o: exit $rc, $err"
err=$("$ember" convert "$hf/llama" -o "$tmp/x.gguf" --type q3_k_xl 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "unknown quantization type 'q3_k_xl' (valid: F32, F16" <<<"$err" || fail "bad type: exit $rc, $err"
mkdir "$tmp/empty"
err=$("$ember" convert "$tmp/empty" -o "$tmp/x.gguf" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "empty/config.json: cannot open" <<<"$err" || fail "empty dir: exit $rc, $err"
[ ! -e "$tmp/x.gguf" ] || fail "a failed conversion left $tmp/x.gguf"
exit $status
