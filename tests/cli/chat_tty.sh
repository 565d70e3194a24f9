#!/usr/bin/env bash
# `ember chat` in a terminal (tmux) on the project's model: the arrow keys edit the line, an empty
# line does not quit, Ctrl-C stops a reply and the next question is still answered, Ctrl-C at the
# prompt clears the line, a bracketed paste and a """ block are one turn each, /save and /load
# round-trip, a small context keeps chatting (the oldest turns leave), Ctrl-D quits with status 0;
# with its replies going to a file it reads plain lines, where Ctrl-C works the same.
# Each reply's line on stderr ("[prompt ...]") counts the turns answered.
# usage: chat_tty.sh EMBER FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 BUILD=$3
MODEL=$(cd "$(dirname "$0")/../.." && pwd)/models/ember-wordnet-21m.Q4_K_M.gguf
WORK=$BUILD/cli_chat_tty
rm -rf "$WORK"
mkdir -p "$WORK"
command -v tmux >/dev/null || { echo "FAIL: tmux is not installed (tools/deps.sh)"; exit 1; }
SOCKET=ember-chat-test-$$
T() { tmux -L "$SOCKET" -f /dev/null "$@"; }
trap 'T kill-server 2>/dev/null' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# start NAME ARGS...: ember chat in a tmux session NAME, stderr in $WORK/NAME.err, status in $WORK/NAME.status
start() {
  local name=$1
  shift
  T new-session -d -s "$name" -x 150 -y 50 \
    "LANG=C.UTF-8 $(printf '%q ' "$EMBER" chat -m "$MODEL" "$@") 2>$WORK/$name.err; echo \$? >$WORK/$name.status"
  wait_for "$name" ">>> " || return 1
}
screen() { T capture-pane -p -J -t "$1" -S - 2>/dev/null; }
# wait_for NAME TEXT: the screen shows TEXT (a fixed string) within 30 s
wait_for() {
  for _ in $(seq 300); do
    screen "$1" | grep -qF -- "$2" && return 0
    sleep 0.1
  done
  fail "$1: the screen never showed '$2':"; screen "$1" | tail -8
  return 1
}
answered() { grep -c '\[prompt ' "$WORK/$1.err" 2>/dev/null; }
# ask NAME N: wait until N replies are finished
replies() {
  for _ in $(seq 300); do
    [ "$(answered "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "$1: $(answered "$1") replies, expected $2: $(tail -3 "$WORK/$1.err")"
  return 1
}
keys() { local name=$1; shift; T send-keys -t "$name" "$@"; }
type_text() { T send-keys -t "$1" -l -- "$2"; }

start main --temp 0 -n 64 || exit 1
grep -q "ember-wordnet-21m.Q4_K_M.gguf, context 1024 tokens" "$WORK/main.err" || fail "banner: $(head -1 "$WORK/main.err")"

# The arrow keys edit the line: "What does dg mean?" becomes "What does dog mean?"
type_text main "What does dg mean?"
keys main Left Left Left Left Left Left Left
type_text main "o"
keys main Enter
replies main 1

# An empty line is no turn and does not quit; Up brings the last message back to be edited
keys main Enter
keys main Up
keys main BSpace BSpace BSpace BSpace BSpace
type_text main "look like?"
keys main Enter
replies main 2

# Ctrl-C at the prompt drops the line
type_text main "garbage that never leaves"
keys main C-c
type_text main "What does tree mean?"
keys main Enter
replies main 3

# Ctrl-C in a reply: one that runs to the end of the context, stopped once it has begun. At a
# temperature of 50 with no filters the draw is all but decided by the seed's noise (pick.h's
# Gumbel-max), so a seed fixes the reply: with seeds 2, 3 and 4 it runs past 900 tokens to the end
# of the context. Should it still end before the key arrives (the key then clears an empty
# prompt), it is asked again with the next seed.
keys main Enter
for setting in "temperature 50" "max_tokens 100000" "top_k 0" "top_p 1" "min_p 0"; do
  type_text main "/set $setting"
  keys main Enter
done
for attempt in 1 2 3; do
  type_text main "/set seed $((attempt + 1))"
  keys main Enter
  type_text main "Say many words."
  keys main Enter
  sleep 0.2
  keys main C-c
  replies main $((3 + attempt)) || break
  tail -1 "$WORK/main.err" | grep -q "; stopped\]" && break
  [ $attempt = 3 ] && fail "Ctrl-C did not stop the reply: $(tail -1 "$WORK/main.err")"
done
asked=$attempt
type_text main "/set temperature 0"
keys main Enter
type_text main "/set max_tokens 64"
keys main Enter
type_text main "What does sun mean?"
keys main Enter
replies main $((asked + 4))
tail -1 "$WORK/main.err" | grep -q "stopped" && fail "the question after Ctrl-C was stopped too"
[ -e "$WORK/main.status" ] && fail "chat exited after Ctrl-C: $(cat "$WORK/main.status")"

# A bracketed paste of two lines is one message; so is a """ block
T set-buffer -b two "$(printf 'What does\nmoon mean?')"
T paste-buffer -p -b two -t main
keys main Enter
replies main $((asked + 5))
type_text main '"""'
keys main Enter
type_text main "What does"
keys main Enter
type_text main 'star mean?"""'
keys main Enter
replies main $((asked + 6))

# /save, /clear, /load, /save: the same file; the conversation goes on from what was loaded
type_text main "/save $WORK/saved.json"
keys main Enter
for _ in $(seq 50); do [ -s "$WORK/saved.json" ] && break; sleep 0.1; done
type_text main "/clear"
keys main Enter
type_text main "/load $WORK/saved.json"
keys main Enter
type_text main "/save $WORK/again.json"
keys main Enter
for _ in $(seq 50); do [ -s "$WORK/again.json" ] && break; sleep 0.1; done
python3 - "$WORK/saved.json" "$asked" <<'EOF' || fail "the saved conversation: $(cat "$WORK/saved.json")"
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
users = [x["content"] for x in m if x["role"] == "user"]
asked = int(sys.argv[2])
assert [x["role"] for x in m] == ["user", "assistant"] * (6 + asked), [x["role"] for x in m]
assert users == ["What does dog mean?", "What does dog look like?", "What does tree mean?"] + ["Say many words."] * asked + [
                 "What does sun mean?", "What does\nmoon mean?", "What does\nstar mean?"], users
assert all(x["content"] for x in m), "an empty reply"
EOF
cmp -s "$WORK/saved.json" "$WORK/again.json" || fail "/load then /save differs: $(diff "$WORK/saved.json" "$WORK/again.json" | head -5)"
type_text main "What does car mean?"
keys main Enter
replies main $((asked + 7))
prompt=$(tail -1 "$WORK/main.err" | sed -n 's/^\[prompt \([0-9]*\) tokens.*/\1/p')
[ "${prompt:-0}" -gt 100 ] || fail "the loaded conversation was not the prompt (${prompt:-?} tokens)"

# Ctrl-D quits, with status 0
keys main C-d
for _ in $(seq 100); do [ -e "$WORK/main.status" ] && break; sleep 0.1; done
[ "$(cat "$WORK/main.status" 2>/dev/null)" = 0 ] || fail "Ctrl-D: status $(cat "$WORK/main.status" 2>/dev/null)"

# A small context: the oldest turns leave with a note, and every question is answered
start small --temp 0 -n 48 -c 160 --system "Answer briefly." || exit 1
for word in dog cat tree sun moon star car house; do
  type_text small "What does $word mean?"
  keys small Enter
  n=$((${n:-0} + 1))
  replies small $n || break
done
grep -q "the context is full: the oldest" "$WORK/small.err" || fail "no note of turns leaving: $(cat "$WORK/small.err")"
[ -e "$WORK/small.status" ] && fail "chat exited when the context filled: $(cat "$WORK/small.err")"
type_text small "/save $WORK/small.json"
keys small Enter
keys small C-d
for _ in $(seq 100); do [ -e "$WORK/small.status" ] && break; sleep 0.1; done
python3 - "$WORK/small.json" <<'EOF' || fail "the small context's conversation: $(cat "$WORK/small.json")"
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
assert m[0] == {"role": "system", "content": "Answer briefly."}, m[0]
assert m[-2] == {"role": "user", "content": "What does house mean?"}, m[-2]
assert len(m) < 17, len(m)
EOF

# Replies to a file from a terminal's keyboard: no editor (it needs a terminal both ways), plain lines
# as the terminal gives them, the path of a build without libedit. Ctrl-C at the prompt still drops
# the line, Ctrl-C in a reply still stops it, and Ctrl-D quits.
T new-session -d -s plain -x 150 -y 50 \
  "LANG=C.UTF-8 $(printf '%q ' "$EMBER" chat -m "$MODEL" --temp 0 -n 32) >$WORK/plain.out 2>$WORK/plain.err; echo \$? >$WORK/plain.status"
for _ in $(seq 300); do grep -qF ">>> " "$WORK/plain.err" 2>/dev/null && break; sleep 0.1; done
type_text plain "garbage that never leaves"
keys plain C-c
type_text plain "What does dog mean?"
keys plain Enter
replies plain 1
for setting in "temperature 50" "max_tokens 100000" "top_k 0" "top_p 1" "min_p 0" "seed 2"; do
  type_text plain "/set $setting"
  keys plain Enter
done
type_text plain "Say many words."
keys plain Enter
sleep 0.2
keys plain C-c
replies plain 2
last=$(grep '\[prompt ' "$WORK/plain.err" | tail -1)
grep -q "; stopped\]" <<<"$last" || fail "plain lines: Ctrl-C did not stop the reply: $last"
type_text plain "/set temperature 0"
keys plain Enter
type_text plain "/save $WORK/plain.json"
keys plain Enter
keys plain C-d
for _ in $(seq 100); do [ -e "$WORK/plain.status" ] && break; sleep 0.1; done
[ "$(cat "$WORK/plain.status" 2>/dev/null)" = 0 ] || fail "plain lines: Ctrl-D: status $(cat "$WORK/plain.status" 2>/dev/null)"
grep -qF ">>>" "$WORK/plain.out" && fail "plain lines: the prompt went into the file of replies"
python3 - "$WORK/plain.json" <<'EOF' || fail "plain lines: the conversation: $(cat "$WORK/plain.json")"
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
assert [x["content"] for x in m if x["role"] == "user"] == ["What does dog mean?", "Say many words."], m
assert all(x["content"] for x in m), "an empty reply"
EOF

[ $fails -eq 0 ] && echo ok
exit $((fails > 0))
