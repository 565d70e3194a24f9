#!/usr/bin/env bash
# `ember quantize --imatrix` end to end on the project's trained model (models/, the 21M target).
# Its f16 source is not in the repository, so the base is the shipped Q4_K_M dequantized to F32
# (`ember quantize ... F32 --allow-requantize`): an exact f32 model in its own right, which is
# quantized again to Q2_K, IQ4_XS and Q4_K_M with and without an importance matrix. Ember has no
# imatrix producer; tests/tools/norm_imatrix.c writes one in llama-imatrix's GGUF format from the
# model's RMSNorm gains (the columns the norms amplify matter more; see there). Checked:
#  - the summary says 31 tensors were weighted (attn_q/k/v, ffn_gate/up of 6 layers, token_embd) and
#    the 12 without an entry are named in the progress output as quantized unweighted;
#  - the weighted file differs from the unweighted one;
#  - perplexity on tests/fixtures/perplexity/text.txt (KL base: the f32 run) with the importance
#    matrix is not above the one without by more than 1% (bench/RESULTS.md, "Quantization quality
#    and perplexity", has the figures).
set -u
ember=$1
build=$3
here=$(cd "$(dirname "$0")/.." && pwd)
model=$here/../models/ember-wordnet-21m.Q4_K_M.gguf
text=$here/fixtures/perplexity/text.txt
status=0
fail() { echo "FAIL: $*"; status=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ember" quantize "$model" "$tmp/f32.gguf" F32 --allow-requantize >/dev/null 2>&1 || { echo "FAIL: dequantize"; exit 1; }
"$build/tests/norm_imatrix" "$tmp/f32.gguf" "$tmp/im.gguf" || { echo "FAIL: norm_imatrix"; exit 1; }
"$ember" perplexity -m "$tmp/f32.gguf" -f "$text" --ctx 128 --save-logits "$tmp/f32.logits" >/dev/null 2>&1 ||
    { echo "FAIL: perplexity of the f32 base"; exit 1; }
ppl() { sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$1"; }

for type in Q2_K IQ4_XS Q4_K_M; do
    "$ember" quantize "$tmp/f32.gguf" "$tmp/plain.gguf" $type --threads 2 >/dev/null 2>&1 || fail "quantize $type"
    "$ember" quantize "$tmp/f32.gguf" "$tmp/im-$type.gguf" $type --imatrix "$tmp/im.gguf" --threads 2 \
        >"$tmp/out" 2>"$tmp/err" || { fail "quantize $type --imatrix: $(cat "$tmp/err")"; continue; }
    grep -q "43 quantized, 31 with importance weights (31 imatrix entries)" "$tmp/out" ||
        fail "$type: summary $(cat "$tmp/out")"
    unweighted=$(grep -c "(no importance values: unweighted)" "$tmp/err")
    [ "$unweighted" = 12 ] || fail "$type: $unweighted tensors reported unweighted, want 12 (attn_output, ffn_down)"
    grep "blk.0.attn_output.weight" "$tmp/err" | grep -q "no importance values" || fail "$type: attn_output not reported"
    cmp -s "$tmp/plain.gguf" "$tmp/im-$type.gguf" && fail "$type: the importance matrix changed nothing"
    "$ember" perplexity -m "$tmp/plain.gguf" --kl-base "$tmp/f32.logits" >"$tmp/p" 2>/dev/null || fail "ppl $type"
    "$ember" perplexity -m "$tmp/im-$type.gguf" --kl-base "$tmp/f32.logits" >"$tmp/w" 2>/dev/null || fail "ppl $type im"
    a=$(ppl "$tmp/p") b=$(ppl "$tmp/w")
    awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && b > 0 && b <= 1.01 * a) }' ||
        fail "$type: PPL $b with the importance matrix, $a without (more than 1% worse)"
    echo "$type: PPL $a without, $b with the importance matrix"
done
exit $status
