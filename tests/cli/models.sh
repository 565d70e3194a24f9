#!/usr/bin/env bash
# The models the project ships (models/, docs/model.md): both load, share one vocabulary, and answer
# chat questions greedily with the words transformers produced from the trained checkpoints
# (tests/fixtures/models/transformers.json, written by tools/model/train.py on the GPU); the quantized
# target reproduces three of transformers' five answers to the letter, the draft two (the others part
# at near-ties that 4-bit weights move). Speculative decoding with the draft model or prompt lookup leaves the target's
# answers unchanged.
set -u
ember=$1
here=$(cd "$(dirname "$0")" && pwd)
models=$here/../../models
target=$models/ember-wordnet-21m.Q4_K_M.gguf
draft=$models/ember-wordnet-draft-4m.Q4_K_M.gguf
fixture=$here/../fixtures/models/transformers.json
status=0
fail() { echo "FAIL: $*"; status=1; }

for m in "$target" "$draft"; do
  "$ember" info "$m" >/dev/null || fail "ember info $m"
done

# transformers' greedy answer of MODEL (target or draft) to QUESTION, from the fixture.
expected() {
  node -e 'const f = require(process.argv[1]); process.stdout.write(f[process.argv[2]].greedy_answers[process.argv[3]])' \
    "$fixture" "$1" "$2"
}
# Ember's greedy answer of GGUF to QUESTION (one turn; extra options after).
answer() { printf '%s\n' "$2" | "$ember" chat -m "$1" --temp 0 -n 80 "${@:3}" 2>/dev/null; }

check() {
  local name=$1 gguf=$2 question=$3
  local want got
  want=$(expected "$name" "$question") || { fail "no expected answer for '$question'"; return; }
  got=$(answer "$gguf" "$question" "${@:4}")
  if [ "$got" = "$want" ]; then
    echo "ok: $name ${*:4} '$question'"
  else
    fail "$name ${*:4} '$question': got '$got', transformers said '$want'"
  fi
}

command -v node >/dev/null || { echo "FAIL: node is needed to read the fixture"; exit 1; }
for q in "Hello, who are you?" "What is the opposite of happy?" "Use the word garden in a sentence."; do
  check target "$target" "$q"
  check target "$target" "$q" --draft-model "$draft"
done
for q in "Hello, who are you?" "What is the opposite of happy?"; do
  check draft "$draft" "$q"
done
check target "$target" "Use the word garden in a sentence." --spec lookup

# Both models tokenize alike (the draft model must share the target's vocabulary).
text='An ember is a hot fragment of wood or coal.'
a=$("$ember" tokenize -m "$target" --ids "$text") b=$("$ember" tokenize -m "$draft" --ids "$text")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the two models tokenize '$text' differently: '$a' / '$b'"
exit $status
