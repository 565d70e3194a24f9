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
# the weights mapped from the file or read into memory: the same tokens
for flag in --mmap --no-mmap; do
    "$EMBER" run -m "$MODEL" --prompt-ids "1 450 4996" -n 12 --temp 0 --print-ids $flag >"$WORK/m" 2>/dev/null || fail "run $flag"
    cmp -s "$WORK/a" "$WORK/m" || fail "greedy output with $flag differs"
done
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

# text with --raw: the prompt is tokenized as `ember tokenize` does (BOS added), the output detokenized
# (without --raw the prompt goes through the chat template: tests/cli/run_chat.sh)
ids=$("$EMBER" tokenize -m "$MODEL" --ids "Once upon a time" 2>/dev/null)
[ -n "$ids" ] || fail "ember tokenize gave no ids"
"$EMBER" run -m "$MODEL" --raw -p "Once upon a time" -n 10 --temp 0 --print-ids >"$WORK/t1" 2>"$WORK/t1.err" || fail "run -p"
"$EMBER" run -m "$MODEL" --prompt-ids "$ids" -n 10 --temp 0 --print-ids >"$WORK/t2" 2>/dev/null || fail "run --prompt-ids $ids"
cmp -s "$WORK/t1" "$WORK/t2" || fail "-p TEXT and --prompt-ids of its tokens continue differently"
grep -q "prompt tokens: $(echo $ids | wc -w)" "$WORK/t1.err" || fail "prompt token count of -p"
"$EMBER" run -m "$MODEL" --raw -p "Once upon a time" -n 10 --temp 0 >"$WORK/text" 2>/dev/null || fail "run -p text output"
want=$("$EMBER" tokenize -m "$MODEL" --decode $(cat "$WORK/t1") 2>/dev/null)
# (--decode treats the ids as a text's start and drops the space SPM prefixes; run continues the prompt)
[ "$(sed 's/^ //' "$WORK/text")" = "$want" ] || fail "streamed text '$(cat "$WORK/text")' differs from the decoded ids '$want'"

# quantized weights run too (K-quants and IQ3_XXS experts, Q8_0 where rows are short)
for spec in "tiny-qwen3moe mix" "tiny-llama q4_k" "tiny-gemma2 bf16" "tiny-flint q8_0"; do
    set -- $spec
    "$EMBER" synth --preset $1 --type $2 -o "$WORK/$1-$2.gguf" --vocab "$VOCAB" || fail "synth $spec"
    out=$("$EMBER" run -m "$WORK/$1-$2.gguf" -p "Hello" -n 6 --temp 0 --print-ids 2>/dev/null) || fail "run $spec"
    [ "$(echo $out | wc -w)" -eq 6 ] || fail "run $spec printed '$out'"
done

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
expect_error 1 "--device expects cpu or cuda" "$EMBER" run -m "$MODEL" --prompt-ids "1" --device tpu

# --device cuda: on a GPU machine it runs there; without a GPU ember says so and runs on the CPU.
greedy_cpu=$("$EMBER" run -m "$MODEL" --prompt-ids "1 2 3" -n 4 --temp 0 --print-ids --device cpu 2>/dev/null)
out=$("$EMBER" run -m "$MODEL" --prompt-ids "1 2 3" -n 4 --temp 0 --print-ids --device cuda 2>"$WORK/cuda.err") ||
  fail "--device cuda exited $?: $(cat "$WORK/cuda.err")"
if [ -e /dev/nvidia0 ]; then
  grep -q "using the CPU" "$WORK/cuda.err" && fail "--device cuda fell back to the CPU on a GPU machine"
else
  grep -q "no usable CUDA device\|no CUDA backend" "$WORK/cuda.err" && grep -q "using the CPU" "$WORK/cuda.err" ||
    fail "--device cuda without a GPU: no warning ($(cat "$WORK/cuda.err"))"
  [ "$out" = "$greedy_cpu" ] || fail "--device cuda fallback: '$out' vs the CPU's '$greedy_cpu'"
fi

[ $fails -eq 0 ] && echo "ok" || echo "$fails failure(s)"
exit $((fails > 0))
