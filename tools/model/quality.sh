#!/usr/bin/env bash
# The quality table of bench/RESULTS.md: every quantization type of a model against its f16 file and
# against its Q8_0 file (the article's reference): size, perplexity, mean KL divergence, top-1
# agreement. Quantized files are made with `ember quantize` from the f16 file; a type the device
# cannot run gets its error in the row.
# Usage: tools/model/quality.sh EMBER MODEL-f16.gguf TEXT WORKDIR [DEVICE] [CHUNKS]
# TYPES="Q8_0 IQ3_XXS" limits the rows to those types.
set -eu
ember=$1 f16=$2 text=$3 work=$4 device=${5:-cpu} chunks=${6:-40}
types=${TYPES:-"Q8_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S Q3_K_M IQ4_XS IQ3_XXS mix"}
mkdir -p "$work"
ppl() { "$ember" perplexity -m "$1" --device "$device" --chunks "$chunks" "${@:2}" 2>"$work/last.err"; }
mib() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.2f", b / 1048576 }'; }
field() { sed -n "s/^$1 *: *\([-0-9.e+]*\).*/\1/p"; }

ppl "$f16" -f "$text" --save-logits "$work/f16.logits" > "$work/f16.out"
[ -f "$work/Q8_0.gguf" ] || "$ember" quantize "$f16" "$work/Q8_0.gguf" Q8_0 > /dev/null 2>&1
ppl "$work/Q8_0.gguf" -f "$text" --save-logits "$work/q8.logits" > /dev/null

echo "| type | MiB | PPL | KL vs f16 | top-1 vs f16 | KL vs Q8_0 | top-1 vs Q8_0 |"
echo "|---|---|---|---|---|---|---|"
printf '| f16 | %s | %s | | | | |\n' "$(mib "$f16")" \
    "$(sed -n 's/^PPL = \([0-9.]*\).*/\1/p' "$work/f16.out")"
for t in $types; do
    file=$work/$t.gguf
    [ -f "$file" ] || "$ember" quantize "$f16" "$file" "$t" > /dev/null 2>&1
    if ! ppl "$file" --kl-base "$work/f16.logits" > "$work/$t.f16.out" ||
       ! ppl "$file" --kl-base "$work/q8.logits" > "$work/$t.q8.out"; then
        printf '| %s | %s | %s | | | | |\n' "$t" "$(mib "$file")" "$(tail -n 1 "$work/last.err")"
        continue
    fi
    printf '| %s | %s | %s | %s | %s%% | %s | %s%% |\n' "$t" "$(mib "$file")" \
        "$(field 'Mean PPL(Q)' < "$work/$t.f16.out")" \
        "$(field 'Mean    KLD' < "$work/$t.f16.out")" "$(field 'Same top p' < "$work/$t.f16.out")" \
        "$(field 'Mean    KLD' < "$work/$t.q8.out")" "$(field 'Same top p' < "$work/$t.q8.out")"
done
