#!/usr/bin/env bash
# `ember quantize` from the command line: a progress line per tensor on stderr, a summary on
# stdout, and bad input failing with exit status 1 and a message that says what is wrong (an
# unknown type lists the valid ones), leaving no output file behind.
set -u
ember=$1 fixtures=$2
status=0
fail() { echo "FAIL: $*"; status=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ember" synth --preset tiny-qwen3moe --type f32 --seed 3 -o "$tmp/f32.gguf" \
    --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" || { echo "FAIL: synth"; exit 1; }

out=$("$ember" quantize "$tmp/f32.gguf" "$tmp/q8.gguf" q8_0 --threads 2 2>"$tmp/err") || fail "q8_0 exited $?"
grep -q "^$tmp/q8.gguf: Q8_0, 27 tensors (16 quantized)" <<<"$out" || fail "summary: $out"
grep -Eq '^\[ *3/ *27\] blk\.0\.attn_q\.weight +f32 +→ q8_0 ' "$tmp/err" || fail "progress line: $(head -3 "$tmp/err")"
grep -Eq '^\[ *10/ *27\] blk\.0\.ffn_gate_inp\.weight +f32 +→ f32 ' "$tmp/err" || fail "router line: $(sed -n 10p "$tmp/err")"
[ "$(grep -c '→' "$tmp/err")" = 27 ] || fail "one progress line per tensor: $(grep -c '→' "$tmp/err")"

# the run of the quantized file is ember's own check that it loads
"$ember" run -m "$tmp/q8.gguf" -p "hello" -n 4 --temp 0 >/dev/null 2>&1 || fail "run on the quantized file"

expect_error() { # WHAT PATTERN ARGS... : exit status 1 and PATTERN on stderr
    local what=$1 pattern=$2
    shift 2
    err=$("$ember" quantize "$@" 2>&1 >/dev/null); rc=$?
    [ $rc -eq 1 ] && grep -q -- "$pattern" <<<"$err" || fail "$what: exit $rc, $err"
}
expect_error "unknown type" "unknown quantization type 'q4_k_xl' (valid: F32, F16, BF16, Q8_0, Q6_K, Q5_K_M" \
    "$tmp/f32.gguf" "$tmp/x.gguf" q4_k_xl
expect_error "missing input" "$tmp/none.gguf: No such file" "$tmp/none.gguf" "$tmp/x.gguf" q4_k_m
expect_error "requantize" "tensor token_embd.weight is already quantized (Q8_0); requantizing it to Q5_0" \
    "$tmp/q8.gguf" "$tmp/x.gguf" q4_k_s
expect_error "requantize names the flag" "allow-requantize" "$tmp/q8.gguf" "$tmp/x.gguf" q4_k_s
expect_error "missing directory" "$tmp/no/such/dir/x.gguf" "$tmp/f32.gguf" "$tmp/no/such/dir/x.gguf" q4_0
expect_error "missing arguments" "IN.gguf, OUT.gguf and TYPE are required" "$tmp/f32.gguf" "$tmp/x.gguf"
expect_error "bad threads" "--threads expects 1..1024" "$tmp/f32.gguf" "$tmp/x.gguf" q4_0 --threads 0
expect_error "missing imatrix" "$tmp/none.dat: cannot open" "$tmp/f32.gguf" "$tmp/x.gguf" q4_0 --imatrix "$tmp/none.dat"
[ ! -e "$tmp/x.gguf" ] || fail "a failed run left $tmp/x.gguf"
ls "$tmp" | grep -q partial && fail "a failed run left a partial file: $(ls "$tmp")"

# with the flag, a quantized file requantizes (and unchanged tensors keep their bytes)
"$ember" quantize "$tmp/q8.gguf" "$tmp/q4.gguf" q4_0 --allow-requantize >/dev/null 2>&1 || fail "--allow-requantize"
"$ember" run -m "$tmp/q4.gguf" -p "hello" -n 4 --temp 0 >/dev/null 2>&1 || fail "run on the requantized file"
exit $status
