#!/usr/bin/env bash
# `ember run` puts its prompt through the model's chat template as the reference renderer
# (@huggingface/jinja, as in chat_template_reference.sh) does: for each conversation the reference
# renders the project model's template (read from the GGUF by tests/js/render_reference.mjs, not by
# Ember), `ember tokenize` turns that text into ids, and `ember run -p` (with --system, or -f) must
# prompt with as many tokens and answer greedily as `ember run --prompt-ids` of those ids does.
# usage: run_template_reference.sh EMBER FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 FIXTURES=$2 BUILD=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=$ROOT/models/ember-wordnet-21m.Q4_K_M.gguf
WORK=$BUILD/cli_run_template_reference
js=$BUILD/js
rm -rf "$WORK"
mkdir -p "$WORK" "$js"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

command -v node >/dev/null && command -v npm >/dev/null || { echo "FAIL: node and npm are needed (tools/deps.sh)"; exit 1; }
package=@huggingface/jinja@0.5.11
if ! (cd "$js" && node -e "process.exit(require('./node_modules/@huggingface/jinja/package.json').version === '0.5.11' ? 0 : 1)") 2>/dev/null; then
  npm install --prefix "$js" --no-audit --no-fund --no-save "$package" >"$js/npm-run-template.log" 2>&1 ||
    { echo "FAIL: npm install $package failed:"; tail -20 "$js/npm-run-template.log"; exit 1; }
fi

# The conversations `ember run` builds: -p; --system and -p; -f of a file whose text has a newline
# and a non-ASCII letter (its final newline is dropped, as run does).
python3 - "$MODEL" "$WORK/cases.json" <<'EOF'
import json, sys
q = "What does dog mean?"
multi = "What does\ncafé mean?"
json.dump({
    "templates": {"model": {"gguf": sys.argv[1]}},
    "conversations": {
        "user": {"messages": [{"role": "user", "content": q}], "add_generation_prompt": True},
        "system": {"messages": [{"role": "system", "content": "You are a dictionary."}, {"role": "user", "content": q}],
                   "add_generation_prompt": True},
        "file": {"messages": [{"role": "user", "content": multi}], "add_generation_prompt": True},
    },
    "pairs": [["model", "user"], ["model", "system"], ["model", "file"]],
}, open(sys.argv[2], "w"), ensure_ascii=False)
EOF
printf 'What does\ncafé mean?\n' >"$WORK/question.txt"
node "$ROOT/tests/js/render_reference.mjs" "$js/node_modules" "$WORK/cases.json" "$WORK/reference" "$FIXTURES" ||
  { echo "FAIL: the reference renderer"; exit 1; }

# check NAME RUN-ARGS...: run's prompt and greedy answer against those of the reference's text
check() {
  local name=$1
  shift
  local expected=$WORK/reference/model__$name/expected.txt
  [ -s "$expected" ] || { fail "$name: the reference rendered nothing"; return; }
  local ids
  ids=$("$EMBER" tokenize -m "$MODEL" --ids -f "$expected" 2>"$WORK/$name.tokenize.err") ||
    { fail "$name: tokenize: $(cat "$WORK/$name.tokenize.err")"; return; }
  "$EMBER" run -m "$MODEL" "$@" --temp 0 -n 16 --print-ids >"$WORK/$name.run" 2>"$WORK/$name.run.err" ||
    { fail "$name: run exited $?: $(cat "$WORK/$name.run.err")"; return; }
  "$EMBER" run -m "$MODEL" --prompt-ids "$ids" --temp 0 -n 16 --print-ids >"$WORK/$name.ids" 2>"$WORK/$name.ids.err" ||
    { fail "$name: run --prompt-ids exited $?: $(cat "$WORK/$name.ids.err")"; return; }
  local want got
  want=$(wc -w <<<"$ids")
  got=$(sed -n 's/^prompt tokens: \([0-9]*\).*/\1/p' "$WORK/$name.run.err")
  [ "$got" = "$want" ] || fail "$name: run's prompt has ${got:-?} tokens, the reference's text $want"
  cmp -s "$WORK/$name.run" "$WORK/$name.ids" ||
    fail "$name: run answered '$(cat "$WORK/$name.run")', the reference's prompt '$(cat "$WORK/$name.ids")'"
  [ "$fails" = 0 ] && echo "ok   $name ($want prompt tokens, the same answer)"
}
check user -p "What does dog mean?"
check system --system "You are a dictionary." -p "What does dog mean?"
check file -f "$WORK/question.txt"

[ $fails -eq 0 ] && echo ok
exit $((fails > 0))
