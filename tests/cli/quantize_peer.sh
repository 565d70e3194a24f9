#!/bin/bash
# llama.cpp reads what `ember quantize` writes: node-llama-cpp 3.21.1 (llama.cpp, CPU build) loads
# the transformers checkpoints of tests/fixtures/hf converted at f32 and quantized by Ember with
# several recipes, and its 16 greedy tokens must be Ember's own on the same file, each token's
# probability within 0.02 (the two quantize activations differently), except after a near-tie
# (the two most likely tokens within 2% of each other), where the comparison stops.
# usage: quantize_peer.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 BUILD=$3
HERE=$(cd "$(dirname "$0")" && pwd)
HF=$HERE/../fixtures/hf
JS=$BUILD/js
WORK=$BUILD/quantize_peer
N=16
mkdir -p "$WORK"
. "$(dirname "$0")/../../tools/llamacpp_lib.sh"
need_llamacpp "$JS" "$WORK/npm.log" || exit 1
ids() { tr -d ' \n' <"$HF/$1/expected.json" | sed -e "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/" | tr ',' ' '; }

families="llama qwen3moe gemma2"
types="Q8_0 Q6_K Q4_K_M Q4_0 IQ4_XS Q3_K_M mix"
prompt=$(ids llama prompt_ids)
models=()
for family in $families; do
    [ "$(ids "$family" prompt_ids)" = "$prompt" ] || { echo "FAIL: $family has another prompt"; exit 1; }
    "$EMBER" convert "$HF/$family" -o "$WORK/$family-f32.gguf" --type f32 >/dev/null ||
        { echo "FAIL: convert $family"; exit 1; }
    for type in $types; do
        model=$WORK/$family-$type.gguf
        rm -f "$model.llama.txt"
        "$EMBER" quantize "$WORK/$family-f32.gguf" "$model" $type >/dev/null 2>"$WORK/quantize.err" ||
            { cat "$WORK/quantize.err"; echo "FAIL: quantize $family $type"; exit 1; }
        models+=("$model")
    done
done
node "$HERE/../peer/llamacpp_greedy.mjs" "$JS/node_modules" $N "$prompt" "${models[@]}" 2>"$WORK/llama.err" ||
    { cat "$WORK/llama.err"; echo "FAIL: llama.cpp"; exit 1; }
status=0
for model in "${models[@]}"; do
    name=$(basename "$model" .gguf)
    "$EMBER" run -m "$model" --prompt-ids "$prompt" -n $N --temp 0 --print-probs >"$model.ember.txt" 2>"$WORK/ember.err" ||
        { cat "$WORK/ember.err"; echo "FAIL: ember run $name"; status=1; continue; }
    result=$(paste -d' ' "$model.ember.txt" "$model.llama.txt" | awk -v n=$N '
        function abs(x) { return x < 0 ? -x : x }
        { e = $1; pe = $2; l = $3; pl = $4; l2 = $5; pl2 = $6; steps++
          if (e == l) { d = abs(pe - pl); if (d > worst) worst = d; same++; if (d > 0.02) { bad = "probability " pe " vs " pl " at step " NR; exit } next }
          if (e == l2 && (pl - pl2) / pl < 0.02) { tie = NR; exit }
          bad = "token " e " vs " l " at step " NR; exit }
        END { if (bad != "") print "FAIL " bad;
              else if (steps < n && tie == 0) print "FAIL only " steps " tokens";
              else printf "ok %d/%d tokens equal%s, max |dp| %.2g\n", same, n, tie ? " (near-tie at step " tie ")" : "", worst }')
    echo "$name: $result"
    case $result in ok*) ;; *) status=1 ;; esac
done
exit $status
