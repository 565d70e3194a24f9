#!/usr/bin/env bash
# `ember run` on the project's model (a chat model): -p goes through the chat template and answers
# as `ember chat` and the server's /v1/chat/completions do at temperature 0; --raw continues the
# text as --prompt-ids of its tokens does; -f FILE, -f - and -p -; --system; the stop-reason line
# for each reason; a random seed by default, printed, that repeats the run.
# usage: run_chat.sh EMBER FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 BUILD=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=$ROOT/models/ember-wordnet-21m.Q4_K_M.gguf
WORK=$BUILD/cli_run_chat
mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() { "$EMBER" run -m "$MODEL" "$@"; }
Q="What does dog mean?"

# Through the template: a real answer, ended by the model's end of turn
run -p "$Q" --temp 0 >"$WORK/answer" 2>"$WORK/answer.err" || fail "run -p exited $?: $(cat "$WORK/answer.err")"
[ "$(wc -w <"$WORK/answer")" -ge 3 ] || fail "no answer: '$(cat "$WORK/answer")'"
grep -qi "dog\|canis\|animal" "$WORK/answer" || fail "not an answer about dogs: $(cat "$WORK/answer")"
[ "$(tail -1 "$WORK/answer.err")" = "stopped: end of text" ] || fail "stop line: $(tail -1 "$WORK/answer.err")"
grep -q "^seed:" "$WORK/answer.err" && fail "a seed printed for greedy decoding"

# ... the same as `ember chat` for the same question
printf '%s\n' "$Q" | "$EMBER" chat -m "$MODEL" --temp 0 >"$WORK/chat" 2>"$WORK/chat.err" || fail "chat exited $?"
cmp -s "$WORK/answer" "$WORK/chat" || fail "run '$(cat "$WORK/answer")' and chat '$(cat "$WORK/chat")' differ"

# ... and as the server's chat completions at temperature 0
. "$ROOT/tools/serve_lib.sh"
if start_server "$WORK/serve.log" "$EMBER" serve -m "$MODEL" --port 0; then
  body=$(python3 -c 'import json,sys; print(json.dumps({"model":"ember-wordnet-21m.Q4_K_M","messages":[{"role":"user","content":sys.argv[1]}],"temperature":0,"max_tokens":512}))' "$Q")
  curl -sS "$url/v1/chat/completions" -H 'content-type: application/json' -d "$body" >"$WORK/server.json"
  served=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$WORK/server.json")
  [ "$served" = "$(cat "$WORK/answer")" ] || fail "the server answered '$served', run '$(cat "$WORK/answer")'"
  kill "$pid"; wait "$pid" 2>/dev/null
else
  fail "ember serve did not start"
fi

# -f FILE, -f - and -p -: the same prompt (one final newline dropped)
printf '%s\n' "$Q" >"$WORK/q.txt"
run -f "$WORK/q.txt" --temp 0 >"$WORK/f" 2>/dev/null || fail "-f exited $?"
printf '%s\n' "$Q" | run -f - --temp 0 >"$WORK/f-" 2>/dev/null || fail "-f - exited $?"
printf '%s' "$Q" | run -p - --temp 0 >"$WORK/p-" 2>/dev/null || fail "-p - exited $?"
for f in f f- p-; do cmp -s "$WORK/answer" "$WORK/$f" || fail "$f: '$(cat "$WORK/$f")'"; done
out=$(run -f "$WORK/missing.txt" 2>&1); [ $? = 1 ] && [ "$out" = "ember run: $WORK/missing.txt: cannot open: No such file or directory" ] ||
  fail "-f missing: $out"

# --system: a longer prompt, the system text in it (the template puts it first)
run -p "$Q" --system "You are a dictionary." --temp 0 -n 4 >/dev/null 2>"$WORK/system.err" || fail "--system exited $?"
with=$(sed -n 's/^prompt tokens: \([0-9]*\).*/\1/p' "$WORK/system.err")
without=$(sed -n 's/^prompt tokens: \([0-9]*\).*/\1/p' "$WORK/answer.err")
[ "${with:-0}" -gt "${without:-0}" ] || fail "--system: prompt of ${with:-?} tokens, without ${without:-?}"

# --raw: plain completion, as --prompt-ids of the text's tokens
ids=$("$EMBER" tokenize -m "$MODEL" --ids "$Q" 2>/dev/null)
run --raw -p "$Q" --temp 0 -n 8 --print-ids >"$WORK/raw" 2>/dev/null || fail "--raw exited $?"
run --prompt-ids "$ids" --temp 0 -n 8 --print-ids >"$WORK/ids" 2>/dev/null || fail "--prompt-ids exited $?"
cmp -s "$WORK/raw" "$WORK/ids" || fail "--raw '$(cat "$WORK/raw")' and --prompt-ids '$(cat "$WORK/ids")' differ"
run -p "$Q" --temp 0 -n 8 --print-ids >"$WORK/templated" 2>/dev/null
cmp -s "$WORK/raw" "$WORK/templated" && fail "-p without --raw continued the text as it is"

# Why it stopped
run -p "$Q" --temp 0 -n 3 >/dev/null 2>"$WORK/err" && [ "$(tail -1 "$WORK/err")" = "stopped: length (-n 3)" ] ||
  fail "length: $(tail -1 "$WORK/err")"
run -p "$Q" --temp 0 -c $((without + 3)) >/dev/null 2>"$WORK/err" &&
  [ "$(tail -1 "$WORK/err")" = "stopped: context full ($((without + 3)) tokens)" ] || fail "context: $(cat "$WORK/err")"
third=$(awk '{print $3}' "$WORK/answer")
if [ -n "$third" ]; then
  run -p "$Q" --temp 0 --stop "$third" >"$WORK/stop" 2>"$WORK/err" &&
    [ "$(tail -1 "$WORK/err")" = "stopped: stop string \"$third\"" ] || fail "stop string: $(tail -1 "$WORK/err")"
  grep -qF -- "$third" "$WORK/stop" && fail "the stop string was printed: $(cat "$WORK/stop")"
fi

# Sampling: a random seed each run, printed; the printed seed repeats the run
sample() { run --raw -p "The" --temp 0.8 -n 24 --print-ids "$@"; }
sample >"$WORK/s1" 2>"$WORK/s1.err" || fail "sampling exited $?"
sample >"$WORK/s2" 2>"$WORK/s2.err"
seed=$(sed -n 's/^seed: //p' "$WORK/s1.err")
[ -n "$seed" ] || fail "no seed line: $(cat "$WORK/s1.err")"
[ "$seed" != "$(sed -n 's/^seed: //p' "$WORK/s2.err")" ] || fail "two runs drew the same seed $seed"
cmp -s "$WORK/s1" "$WORK/s2" && fail "two runs without --seed printed the same tokens"
sample --seed "$seed" >"$WORK/s3" 2>/dev/null
cmp -s "$WORK/s1" "$WORK/s3" || fail "--seed $seed did not repeat the run"
sample --seed 7 >"$WORK/s4" 2>/dev/null; sample --seed 7 >"$WORK/s5" 2>/dev/null
cmp -s "$WORK/s4" "$WORK/s5" || fail "the same --seed, different tokens"

# Errors: one line, no usage; the nearest option suggested
out=$(run -p "$Q" --tmep 0 2>&1); [ $? = 1 ] && [ "$out" = "ember run: unknown option '--tmep' (did you mean --temp?)" ] ||
  fail "unknown option: $out"
out=$(run -p "$Q" --raw --system x 2>&1); [ $? = 1 ] && grep -q "does not go with --raw" <<<"$out" || fail "--system --raw: $out"
out=$(run -p "$Q" -n 2>&1); [ $? = 1 ] && [ "$out" = "ember run: -n needs a value" ] || fail "-n without a value: $out"
out=$("$EMBER" chat -m "$MODEL" --temperatur 1 2>&1 </dev/null); [ $? = 1 ] && grep -q "did you mean --temperature" <<<"$out" ||
  fail "chat unknown option: $out"
out=$(run -p "$Q" --bogus 2>&1); [ $? = 1 ] && [ "$out" = "ember run: unknown option '--bogus' (ember run --help lists them)" ] ||
  fail "an unknown last option: $out"
out=$("$EMBER" chat -m "$MODEL" --bogus 2>&1 </dev/null); [ $? = 1 ] &&
  [ "$out" = "ember chat: unknown option '--bogus' (ember chat --help lists them)" ] || fail "chat, an unknown last option: $out"
out=$("$EMBER" serve -m "$MODEL" --treads 2 2>&1); [ $? = 1 ] && [ "$out" = "ember serve: unknown option '--treads' (did you mean --threads?)" ] ||
  fail "serve unknown option: $out"
out=$("$EMBER" serve -m "$MODEL" --bogus 2>&1); [ $? = 1 ] && [ "$out" = "ember serve: unknown option '--bogus' (ember serve --help lists them)" ] ||
  fail "serve, an unknown last option: $out"
out=$("$EMBER" serve -m "$MODEL" --port 2>&1); [ $? = 1 ] && [ "$out" = "ember serve: --port needs a value" ] || fail "serve --port: $out"

[ $fails -eq 0 ] && echo ok
exit $((fails > 0))
