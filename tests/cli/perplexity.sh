#!/usr/bin/env bash
# `ember perplexity` on the tiny Llama checkpoint of tests/fixtures/hf, converted to f32:
#  - against transformers: tests/fixtures/perplexity/llama_f32.json (tools/reference/make_ppl_fixture.py,
#    same text, same windows) has the tokens, the window count, the running perplexity after each
#    window and the final one; Ember's must agree within 0.1%. Without that file this part is skipped,
#    and says so;
#  - a model against its own saved log-probabilities: KL divergence ~0, 100% top-1 agreement, equal
#    perplexities; a q8_0 conversion against the f32 base: KL > 0, a small change in perplexity;
#  - bad input: exit status 1 and a message that says what is wrong.
set -u
ember=$1
here=$(cd "$(dirname "$0")/.." && pwd)
hf=$here/fixtures/hf/llama
text=$here/fixtures/perplexity/text.txt
reference=$here/fixtures/perplexity/llama_f32.json
ctx=64
status=0
fail() { echo "FAIL: $*"; status=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ember" convert "$hf" -o "$tmp/f32.gguf" --type f32 >/dev/null || { echo "FAIL: convert f32"; exit 1; }
"$ember" convert "$hf" -o "$tmp/q8.gguf" --type q8_0 >/dev/null || { echo "FAIL: convert q8_0"; exit 1; }

# A number after `label` on a line of `file` (the first match).
number() { sed -n "s/^$2 *\([-+0-9.eE]*\).*/\1/p" "$1" | head -1; }
# True when a and b agree within a relative tolerance.
close() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
                                                       exit !(a != "" && b != "" && d <= tol * m) }'; }
# True when awk's comparison `expr` holds for x.
holds() { awk -v x="$1" "BEGIN { exit !(x != \"\" && ($2)) }"; }

# The windows: n_tokens / ctx of them, each scoring positions ctx/2 .. ctx-2.
n_tokens=$("$ember" tokenize -m "$tmp/f32.gguf" --ids -f "$text" | wc -w)
"$ember" perplexity -m "$tmp/f32.gguf" -f "$text" --ctx $ctx --save-logits "$tmp/f32.logits" >"$tmp/out" 2>"$tmp/err" \
  || fail "perplexity exited $?: $(cat "$tmp/err")"
windows=$((n_tokens / ctx))
scored=$((windows * (ctx - 1 - ctx / 2)))
grep -q "^tokens: $((windows * ctx)) evaluated in $windows windows of $ctx ($scored scored), of $n_tokens in" \
  "$tmp/out" || fail "window count ($n_tokens tokens): $(cat "$tmp/out")"
ppl=$(sed -n 's/^PPL = \([0-9.]*\) +\/- \([0-9.]*\)$/\1/p' "$tmp/out")
holds "$ppl" "x > 1" || fail "no PPL line: $(cat "$tmp/out")"
progress=$(tail -1 "$tmp/err")
grep -Eq "^\[1\][0-9]+\.[0-9]{4},\[2\][0-9]+\.[0-9]{4},.*\[$windows\][0-9]+\.[0-9]{4},$" <<<"$progress" \
  || fail "progress line: $progress"
last=$(sed -e 's/.*\[[0-9]*\]\([0-9.]*\),$/\1/' <<<"$progress")
close "$last" "$ppl" 1e-6 || fail "the last running PPL $last is not the final $ppl"

# --chunks: the running PPL after 3 windows is the same as a run of 3 windows.
"$ember" perplexity -m "$tmp/f32.gguf" -f "$text" --ctx $ctx --chunks 3 >"$tmp/out3" 2>"$tmp/err3" || fail "--chunks 3"
third=$(sed -e 's/.*\[3\]\([0-9.]*\),.*/\1/' <<<"$progress")
got=$(sed -n 's/^PPL = \([0-9.]*\) .*/\1/p' "$tmp/out3")
[ "$got" = "$third" ] || fail "--chunks 3: PPL $got, the full run's third window $third"

# The smallest window, shorter than a KV block: 3 scored positions a window.
"$ember" perplexity -m "$tmp/f32.gguf" -f "$text" --ctx 8 --chunks 2 >"$tmp/out8" 2>"$tmp/err8" \
  || fail "--ctx 8 exited $?: $(cat "$tmp/err8")"
grep -q "^tokens: 16 evaluated in 2 windows of 8 (6 scored)" "$tmp/out8" || fail "--ctx 8: $(cat "$tmp/out8")"

# Against transformers, when the reference is there.
json() { tr -d ' \n' <"$reference" | sed -e "s/.*\"$1\":\([^],}]*\).*/\1/"; }
json_list() { tr -d ' \n' <"$reference" | sed -e "s/.*\"$1\":\[\([^]]*\)\].*/\1/" | tr ',' ' '; }
if [ -f "$reference" ]; then
  [ "$(json ctx)" = $ctx ] || fail "the reference was made with ctx $(json ctx), this test uses $ctx"
  want=$(json_list tokens_first_64)
  got=$("$ember" tokenize -m "$tmp/f32.gguf" --ids -f "$text" | cut -d' ' -f1-64)
  [ "$got" = "$want" ] || fail "first tokens: Ember '$got', transformers '$want'"
  want=$(json_list tokens_last_64)
  got=$("$ember" tokenize -m "$tmp/f32.gguf" --ids -f "$text" | tr ' ' '\n' | tail -64 | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] || fail "last tokens: Ember '$got', transformers '$want'"
  [ "$(json n_tokens)" = "$n_tokens" ] || fail "tokens in the text: Ember $n_tokens, transformers $(json n_tokens)"
  [ "$(json n_chunks)" = "$windows" ] || fail "windows: Ember $windows, transformers $(json n_chunks)"
  close "$ppl" "$(json ppl)" 1e-3 || fail "PPL: Ember $ppl, transformers $(json ppl) (more than 0.1% apart)"
  k=0
  for want in $(json_list chunk_ppl); do
    k=$((k + 1))
    got=$(sed -e "s/.*\[$k\]\([0-9.]*\),.*/\1/" <<<"$progress")
    close "$got" "$want" 1e-3 || fail "running PPL after window $k: Ember $got, transformers $want"
  done
  [ $k = "$windows" ] || fail "the reference has $k running values for $windows windows"
  [ $status = 0 ] && echo "ok: PPL $ppl, transformers $(json ppl), over $windows windows"
else
  echo "SKIPPED: no $reference: the comparison with transformers did not run" \
       "(make it with tools/reference/make_ppl_fixture.py)"
fi

# The same model against its own saved log-probabilities.
"$ember" perplexity -m "$tmp/f32.gguf" --kl-base "$tmp/f32.logits" -f "$text" >"$tmp/self" 2>"$tmp/err" \
  || fail "--kl-base of itself exited $?: $(cat "$tmp/err")"
kld=$(number "$tmp/self" "Mean    KLD:")
holds "$kld" "x >= 0 && x < 1e-4" || fail "KL of a model against itself: '$kld'"
holds "$(number "$tmp/self" "Maximum KLD:")" "x < 1e-4" || fail "max KL of a model against itself"
holds "$(number "$tmp/self" "Same top p:")" "x == 100" || fail "top-1 agreement with itself: $(cat "$tmp/self")"
close "$(number "$tmp/self" "Mean PPL(base) *:")" "$ppl" 1e-6 || fail "PPL(base) is not the saved run's $ppl"
close "$(number "$tmp/self" "Mean PPL(Q) *:")" "$ppl" 1e-6 || fail "PPL(Q) of the same model is not $ppl"

# q8_0 against the f32 base; the tokens come from the file.
"$ember" perplexity -m "$tmp/q8.gguf" --kl-base "$tmp/f32.logits" >"$tmp/q8" 2>"$tmp/err" \
  || fail "q8_0 --kl-base exited $?: $(cat "$tmp/err")"
kld=$(number "$tmp/q8" "Mean    KLD:")
holds "$kld" "x > 1e-7 && x < 0.05" || fail "KL of q8_0 against f32: '$kld'"
ppl_q8=$(number "$tmp/q8" "Mean PPL(Q) *:")
delta=$(number "$tmp/q8" "Mean PPL(Q)-PPL(base) *:")
holds "$delta" "x != 0" && close "$ppl_q8" "$ppl" 0.02 || fail "q8_0 PPL $ppl_q8 (Δ $delta) against f32 $ppl"
difference=$(awk -v a="$ppl_q8" -v b="$ppl" 'BEGIN { print a - b }')
close "$difference" "$delta" 1e-3 || fail "Δ PPL $delta is not $ppl_q8 - $ppl"
same=$(number "$tmp/q8" "Same top p:")
holds "$same" "x > 50 && x <= 100" || fail "top-1 agreement of q8_0: '$same'"
[ $status = 0 ] && echo "ok: q8_0 against f32: KL $kld, Δ PPL $delta, same top $same%"

# Bad input.
expect_error() { # MESSAGE-PATTERN ARGS...
  local pattern=$1
  shift
  err=$("$ember" perplexity "$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 1 ] && grep -q "^ember perplexity: .*$pattern" <<<"$err" || fail "perplexity $*: exit $rc, '$err'"
}
expect_error "cannot open" -m "$tmp/f32.gguf" -f "$tmp/missing.txt"
err=$("$ember" perplexity -m "$tmp/f32.gguf" -f "$tmp/missing.txt" 2>&1 >/dev/null)
[ "$err" = "ember perplexity: $tmp/missing.txt: cannot open: No such file or directory" ] || fail "the missing file named once: '$err'"
expect_error "a text is required" -m "$tmp/f32.gguf"
expect_error "unknown option '--chunk' (did you mean --chunks?)" -m "$tmp/f32.gguf" -f "$text" --chunk 2
expect_error "unknown option '--bogus' (ember perplexity --help lists them)" -m "$tmp/f32.gguf" -f "$text" --bogus
expect_error "--chunks needs a value" -m "$tmp/f32.gguf" -f "$text" --chunks
expect_error "a model is required" -f "$text"
expect_error "too small" -m "$tmp/f32.gguf" -f "$text" --ctx 4
expect_error "longer than the model's context of 256" -m "$tmp/f32.gguf" -f "$text" --ctx 512
printf 'Too short for a window.' >"$tmp/short.txt"
expect_error "less than one window of $ctx" -m "$tmp/f32.gguf" -f "$tmp/short.txt" --ctx $ctx
expect_error "not both" -m "$tmp/f32.gguf" -f "$text" --save-logits "$tmp/x" --kl-base "$tmp/f32.logits"
expect_error "windows of $ctx" -m "$tmp/f32.gguf" --kl-base "$tmp/f32.logits" --ctx 32
# Another text than the base file's: the first differing token is named.
sed -e 's/Ember is a small/Ember is a tiny/' "$text" >"$tmp/other.txt"
expect_error "not the same text" -m "$tmp/f32.gguf" --kl-base "$tmp/f32.logits" -f "$tmp/other.txt"
expect_error "not a file of saved log-probabilities" -m "$tmp/f32.gguf" --kl-base "$text"
head -c 100000 "$tmp/f32.logits" >"$tmp/cut.logits"
expect_error "truncated" -m "$tmp/f32.gguf" --kl-base "$tmp/cut.logits"
# A model with another vocabulary (synth's tiny Llama has the reference Llama vocabulary).
"$ember" synth --preset tiny-llama -o "$tmp/other.gguf" >/dev/null || fail "synth tiny-llama"
expect_error "another vocabulary" -m "$tmp/other.gguf" --kl-base "$tmp/f32.logits"
[ ! -e "$tmp/x" ] || fail "a refused run left its --save-logits file"
exit $status
