#!/bin/bash
# Peer comparison with llama.cpp: node-llama-cpp 3.21.1 (CPU build) loads the same synthetic GGUF
# files as ember and continues the same prompt greedily for 32 tokens; the tokens must agree, and
# so must each token's probability. llama.cpp keeps its KV cache in f16 where ember keeps f32, so
# the probabilities differ by about 1e-3; the one legitimate disagreement is a near-tie (the two
# most likely tokens within 2% of each other), after which the two continuations part and the
# comparison stops.
# usage: peer_llamacpp.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 FIXTURES=$2 BUILD=$3
HERE=$(cd "$(dirname "$0")" && pwd)
JS=$BUILD/js
WORK=$BUILD/peer_llamacpp
mkdir -p "$WORK"
command -v node >/dev/null && command -v npm >/dev/null ||
    { echo "FAIL: node and npm are needed for the llama.cpp comparison (tools/deps.sh --with-node)"; exit 1; }
if ! grep -qs '"version": "3.21.1"' "$JS/node_modules/node-llama-cpp/package.json"; then
    npm install --prefix "$JS" --no-audit --no-fund --loglevel=error -E --omit=optional \
        node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1 >"$WORK/npm.log" 2>&1 ||
        { cat "$WORK/npm.log"; echo "FAIL: npm install node-llama-cpp"; exit 1; }
fi

PROMPT="1 450 4996 17354 1701 29916 12500 975 278 17366 11203 29889"
N=32
PRESETS="tiny-llama tiny-qwen2 tiny-qwen3 tiny-qwen3moe tiny-gemma2 tiny-gemma3 tiny-mixtral"
TYPES=${PEER_TYPES:-f32 q8_0}
status=0
models=()
for type in $TYPES; do
    for preset in $PRESETS; do
        model=$WORK/$preset-$type.gguf
        rm -f "$model.llama.txt"
        "$EMBER" synth --preset "$preset" --type "$type" --seed 5 -o "$model" \
            --vocab "$FIXTURES/vocab/ggml-vocab-llama-spm.gguf" || { echo "FAIL: synth $preset $type"; exit 1; }
        models+=("$model")
    done
done
# one node process for all models: starting llama.cpp is the slow part
node "$HERE/../peer/llamacpp_greedy.mjs" "$JS/node_modules" $N "$PROMPT" "${models[@]}" 2>"$WORK/llama.err" ||
    { cat "$WORK/llama.err"; echo "FAIL: llama.cpp"; exit 1; }

for model in "${models[@]}"; do
    name=$(basename "$model" .gguf)
    "$EMBER" run -m "$model" --prompt-ids "$PROMPT" -n $N --temp 0 --print-probs >"$model.ember.txt" 2>"$WORK/ember.err" ||
        { cat "$WORK/ember.err"; echo "FAIL: ember run $name"; status=1; continue; }
    result=$(paste -d' ' "$model.ember.txt" "$model.llama.txt" | awk -v n=$N '
        function abs(x) { return x < 0 ? -x : x }
        { e = $1; pe = $2; l = $3; pl = $4; l2 = $5; pl2 = $6; steps++
          if (e == l) { d = abs(pe - pl); if (d > worst) worst = d; same++; if (d > 0.01) { bad = "probability " pe " vs " pl " at step " NR; exit } next }
          if (e == l2 && (pl - pl2) / pl < 0.02) { tie = NR; exit }
          bad = "token " e " vs " l " at step " NR; exit }
        END { if (bad != "") print "FAIL " bad;
              else if (steps < n && tie == 0) print "FAIL only " steps " tokens";
              else printf "ok %d/%d tokens equal%s, max |dp| %.2g\n", same, n, tie ? " (near-tie at step " tie ")" : "", worst }')
    echo "$name: $result"
    case $result in ok*) ;; *) status=1 ;; esac
done
exit $status
