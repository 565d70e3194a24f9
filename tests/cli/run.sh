#!/bin/bash
# `ember synth` and `ember run` from the outside: exit statuses, what goes to stdout and stderr,
# determinism of greedy and seeded sampling, and clear errors for bad input.
# usage: run.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 FIXTURES=$2 BUILD=$3
WORK=$BUILD/cli_run
mkdir -p "$WORK"
VOCAB=$FIXTURES/vocab/ggml-vocab-llama-spm.gguf
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error STATUS NEEDLE CMD...: the command exits with STATUS and stderr holds NEEDLE
expect_error() {
    local want=$1 needle=$2
    shift 2
    "$@" >"$WORK/out" 2>"$WORK/err"
    local got=$?
    [ $got -eq "$want" ] || fail "'$*' exited $got, expected $want"
    grep -q -- "$needle" "$WORK/err" || fail "'$*' stderr lacks '$needle': $(cat "$WORK/err")"
}

MODEL=$WORK/tiny-llama.gguf
"$EMBER" synth --preset tiny-llama --type f32 --seed 3 -o "$MODEL" --vocab "$VOCAB" || fail "synth tiny-llama"
[ -s "$MODEL" ] || fail "synth wrote nothing"

# greedy: deterministic, N ids on one line, timings on stderr
"$EMBER" run -m "$MODEL" --prompt-ids "1 450 4996" -n 12 --temp 0 --print-ids >"$WORK/a" 2>"$WORK/a.err" || fail "run greedy"
"$EMBER" run -m "$MODEL" --prompt-ids "1 450 4996" -n 12 --temp 0 --print-ids -t 1 >"$WORK/b" 2>/dev/null || fail "run greedy 1 thread"
[ "$(wc -w <"$WORK/a")" -eq 12 ] || fail "greedy printed $(wc -w <"$WORK/a") ids, expected 12"
cmp -s "$WORK/a" "$WORK/b" || fail "greedy output depends on the thread count"
for id in $(cat "$WORK/a"); do [ "$id" -ge 0 ] && [ "$id" -lt 32000 ] || fail "id $id out of range"; done
grep -q "prompt tokens: 3" "$WORK/a.err" || fail "no prompt token count: $(cat "$WORK/a.err")"
grep -q "prefill: .* ms (.* tok/s)" "$WORK/a.err" || fail "no prefill timing"
grep -q "decode: 12 tokens, .* tok/s" "$WORK/a.err" || fail "no decode speed"

# --print-probs: the greedy token is the most likely one, so its probability is the largest
"$EMBER" run -m "$MODEL" --prompt-ids "1 450 4996" -n 12 --temp 0 --print-probs >"$WORK/p" 2>/dev/null || fail "run --print-probs"
[ "$(awk '{print $1}' "$WORK/p" | tr '\n' ' ' | sed 's/ $//')" = "$(cat "$WORK/a")" ] || fail "--print-probs ids differ"
awk '$2 <= 0 || $2 > 1 { exit 1 }' "$WORK/p" || fail "probability out of (0, 1]"

# sampling: the same seed repeats, another seed (almost surely) does not
run_seed() { "$EMBER" run -m "$MODEL" --prompt-ids "1 450" -n 16 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed "$1" --print-ids 2>/dev/null; }
s1=$(run_seed 1) s1b=$(run_seed 1) s2=$(run_seed 2)
[ "$s1" = "$s1b" ] || fail "same seed, different output"
[ "$s1" != "$s2" ] || fail "seeds 1 and 2 gave the same 16 tokens"
[ "$s1" != "$(cat "$WORK/a")" ] || fail "sampling at temperature 1.5 equals greedy"
"$EMBER" run -m "$MODEL" --prompt-ids "1 450" -n 4 --repeat-penalty 1.3 --temp 0 --print-ids >/dev/null 2>&1 || fail "repeat penalty"

# bad input: clear message, status 1
expect_error 1 "No such file" "$EMBER" run -m "$WORK/missing.gguf" --prompt-ids "1" -n 1
expect_error 1 "-n expects a positive" "$EMBER" run -m "$MODEL" --prompt-ids "1" -n 0
expect_error 1 "unknown architecture 'bert'" "$EMBER" run -m "$FIXTURES/vocab/ggml-vocab-bert-bge.gguf" --prompt-ids "1" -n 1
expect_error 1 "missing tensor token_embd.weight" "$EMBER" run -m "$VOCAB" --prompt-ids "1" -n 1
expect_error 1 "the prompt has 5 tokens; the context holds 4" "$EMBER" run -m "$MODEL" --prompt-ids "1 2 3 4 5" -c 4 -n 1
expect_error 1 "outside the vocabulary of 32000" "$EMBER" run -m "$MODEL" --prompt-ids "1 32000" -n 1
expect_error 1 "a prompt is required" "$EMBER" run -m "$MODEL"
expect_error 1 "unknown option '--bogus'" "$EMBER" run -m "$MODEL" --bogus 1
expect_error 1 "--temp expects a number" "$EMBER" run -m "$MODEL" --prompt-ids "1" --temp -1
expect_error 1 "unknown preset 'tiny-gpt'" "$EMBER" synth --preset tiny-gpt -o "$WORK/x.gguf" --vocab "$VOCAB"
expect_error 1 "unknown type 'q3_k'" "$EMBER" synth --preset tiny-llama --type q3_k -o "$WORK/x.gguf" --vocab "$VOCAB"
expect_error 1 "--preset and -o are required" "$EMBER" synth --type f32

[ $fails -eq 0 ] && echo "ok" || echo "$fails failure(s)"
exit $((fails > 0))
