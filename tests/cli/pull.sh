#!/bin/bash
# `ember pull`, `list`, `rm` and `--hf` against a fake Hub on this machine (tests/hub/fake_hub.mjs):
# downloads land in huggingface_hub's cache layout with the right bytes, survive a connection that
# breaks off (resumed with Range, in the same pull and in the next one), refuse bytes whose sha256
# is wrong, share one download between two concurrent pulls, follow a redirect to another host
# name without carrying the token there, find a snapshot another tool laid out, work offline from
# the cache, and a split model pulled or opened locally generates what the unsplit one does.
# usage: pull.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
EMBER=$1 FIXTURES=$2 BUILD=$3
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$BUILD/cli_pull
rm -rf "$WORK"
mkdir -p "$WORK"
VOCAB=$FIXTURES/vocab/ggml-vocab-llama-spm.gguf
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error NEEDLE CMD...: the command exits with status 1 (an error, not a crash) and stderr holds NEEDLE
expect_error() {
    local needle=$1
    shift
    "$@" >"$WORK/out" 2>"$WORK/err"
    local got=$?
    [ $got -eq 1 ] || fail "'$*' exited $got, expected 1"
    grep -q -- "$needle" "$WORK/err" || fail "'$*' stderr lacks '$needle': $(cat "$WORK/err")"
}

# The repositories the fake Hub serves.
HUB=$WORK/hub
mkdir -p "$HUB/test/tiny-GGUF" "$HUB/test/split-GGUF/Q8_0" "$HUB/test/gated-GGUF" "$HUB/test/ambiguous-GGUF"
MODEL=$HUB/test/tiny-GGUF/tiny-Q8_0.gguf
"$EMBER" synth --preset tiny-llama --type q8_0 --seed 5 -o "$MODEL" --vocab "$VOCAB" || fail "synth q8_0"
"$EMBER" synth --preset tiny-llama --type q4_k --seed 5 -o "$HUB/test/tiny-GGUF/tiny-Q4_K_M.gguf" --vocab "$VOCAB" ||
    fail "synth q4_k"
echo "projector, not a model" >"$HUB/test/tiny-GGUF/mmproj-tiny-Q4_K_M.gguf"
echo "# tiny" >"$HUB/test/tiny-GGUF/README.md"
"$BUILD/tests/split_gguf" "$MODEL" 3 "$HUB/test/split-GGUF/Q8_0/tiny-Q8_0" || fail "split_gguf"
cp "$MODEL" "$HUB/test/gated-GGUF/tiny-Q8_0.gguf"
echo "secret-token" >"$HUB/test/gated-GGUF/.token"
echo a >"$HUB/test/ambiguous-GGUF/a-Q8_0.gguf"
echo b >"$HUB/test/ambiguous-GGUF/b-Q8_0.gguf"
SHA=$(sha256sum <"$MODEL" | cut -d' ' -f1)
commit_of() { printf '%s' "$1" | sha1sum | cut -d' ' -f1; }
COMMIT=$(commit_of test/tiny-GGUF)

LOG=$WORK/hub.log
node "$HERE/../hub/fake_hub.mjs" "$HUB" "$LOG" "$WORK/port" 2>"$WORK/hub.err" &
HUB_PID=$!
trap 'kill $HUB_PID 2>/dev/null' EXIT
for _ in $(seq 100); do [ -s "$WORK/port" ] && break; sleep 0.1; done
[ -s "$WORK/port" ] || { echo "FAIL: the fake Hub did not start: $(cat "$WORK/hub.err")"; exit 1; }
PORT=$(cat "$WORK/port")
export HF_ENDPOINT=http://127.0.0.1:$PORT HF_HOME=$WORK/home
unset HF_TOKEN HF_HUB_CACHE HF_HUB_OFFLINE
CACHE=$HF_HOME/hub
REPO_DIR=$CACHE/models--test--tiny-GGUF
control() { curl -s -X POST "$HF_ENDPOINT/_control?$1" >/dev/null || fail "control $1"; }
blob_gets() { grep -c "\"url\":\"/_blobs/$1\"" "$LOG"; }

# Bad input: a clear error and status 1, never a crash.
expect_error "is not a Hub model" "$EMBER" pull nonsense
expect_error "is not a Hub model" "$EMBER" pull "test/--bad"
expect_error "quantization tag 'Q4-K' is not" "$EMBER" pull test/tiny-GGUF:Q4-K
expect_error "not a .gguf file" "$EMBER" pull test/tiny-GGUF/README.md
expect_error "test/missing: not found on $HF_ENDPOINT (HTTP 404)" "$EMBER" pull test/missing
expect_error "has no .gguf model with the tag Q5_K_M; it has: tiny-Q4_K_M.gguf, tiny-Q8_0.gguf" \
    "$EMBER" pull test/tiny-GGUF:Q5_K_M
expect_error "has no file nope.gguf" "$EMBER" pull test/tiny-GGUF/nope.gguf
expect_error "the tag Q8_0 matches 2 models (a-Q8_0.gguf, b-Q8_0.gguf)" "$EMBER" pull test/ambiguous-GGUF:Q8_0
expect_error "Accept its license on $HF_ENDPOINT/test/gated-GGUF" "$EMBER" pull test/gated-GGUF
grep -q "set HF_TOKEN or pass --hf-token" "$WORK/err" || fail "the 401 message does not say how to give a token"
expect_error "403 Forbidden" "$EMBER" pull --hf-token wrong test/gated-GGUF
expect_error "a model is required" "$EMBER" run -p hi
expect_error "not both" "$EMBER" run -m "$MODEL" --hf test/tiny-GGUF -p hi
[ ! -e "$REPO_DIR" ] || fail "failed pulls left $REPO_DIR"

# The default pick (Q4_K_M first; the mmproj file is no model), in huggingface_hub's layout.
path=$("$EMBER" pull test/tiny-GGUF 2>"$WORK/err") || fail "pull default: $(cat "$WORK/err")"
[ "$path" = "$REPO_DIR/snapshots/$COMMIT/tiny-Q4_K_M.gguf" ] || fail "default pick: $path"
cmp -s "$path" "$HUB/test/tiny-GGUF/tiny-Q4_K_M.gguf" || fail "default pick: wrong bytes"
[ ! -s "$WORK/err" ] || fail "stderr is not a terminal, yet the pull wrote: $(cat "$WORK/err")"
[ "$(cat "$REPO_DIR/refs/main")" = "$COMMIT" ] || fail "refs/main: $(cat "$REPO_DIR/refs/main")"
Q4_SHA=$(sha256sum <"$HUB/test/tiny-GGUF/tiny-Q4_K_M.gguf" | cut -d' ' -f1)
[ "$(readlink "$path")" = "../../blobs/$Q4_SHA" ] || fail "snapshot link: $(readlink "$path")"
grep -q '"url":"/api/models/test/tiny-GGUF/tree/'"$COMMIT"'?recursive=true&cursor=3"' "$LOG" ||
    fail "the second page of the listing was not read"
grep -q "\"host\":\"localhost:$PORT\",\"url\":\"/_blobs/$Q4_SHA\"" "$LOG" || fail "the redirect to localhost was not followed"

# A connection that breaks off half-way twice: the same pull resumes with Range and ends right.
control drop=2
path=$("$EMBER" pull test/tiny-GGUF:q8_0 2>"$WORK/err") || fail "pull with drops: $(cat "$WORK/err")"
[ "$path" = "$REPO_DIR/snapshots/$COMMIT/tiny-Q8_0.gguf" ] || fail "q8_0 pick: $path"
cmp -s "$path" "$MODEL" || fail "resumed download: wrong bytes"
[ "$(blob_gets "$SHA")" -eq 3 ] || fail "expected 3 requests of the blob, got $(blob_gets "$SHA")"
grep "/_blobs/$SHA" "$LOG" | grep -q '"range":"bytes=[1-9][0-9]*-"' || fail "no Range request resumed the blob"

# Broken more often than one pull tries: the partial file stays and the next pull resumes it.
"$EMBER" rm test/tiny-GGUF:Q8_0 >/dev/null || fail "rm Q8_0"
[ ! -e "$REPO_DIR/blobs/$SHA" ] || fail "rm left the Q8_0 blob"
control drop=4
expect_error "the next pull resumes there" "$EMBER" pull test/tiny-GGUF/tiny-Q8_0.gguf
partial=$REPO_DIR/blobs/$SHA.incomplete
kept=$(stat -c %s "$partial" 2>/dev/null || echo 0)
[ "$kept" -gt 0 ] && [ "$kept" -lt "$(stat -c %s "$MODEL")" ] || fail "the partial file holds $kept bytes"
[ ! -e "$REPO_DIR/blobs/$SHA" ] && [ ! -e "$REPO_DIR/snapshots/$COMMIT/tiny-Q8_0.gguf" ] ||
    fail "a partial download sits at the final path"
"$EMBER" pull test/tiny-GGUF/tiny-Q8_0.gguf >/dev/null 2>"$WORK/err" || fail "resuming pull: $(cat "$WORK/err")"
grep "/_blobs/$SHA" "$LOG" | tail -1 | grep -q "\"range\":\"bytes=$kept-\"" || fail "the next pull did not resume at $kept"
cmp -s "$REPO_DIR/snapshots/$COMMIT/tiny-Q8_0.gguf" "$MODEL" || fail "resumed across runs: wrong bytes"
[ ! -e "$partial" ] || fail "the partial file outlived the download"

# Bytes whose sha256 is not the listed one are refused; nothing is installed.
"$EMBER" rm test/tiny-GGUF:Q8_0 >/dev/null || fail "rm Q8_0"
control corrupt=1
expect_error "the file was discarded" "$EMBER" pull test/tiny-GGUF:Q8_0
grep -q "SHA-256 .* but the Hub lists $SHA" "$WORK/err" || fail "the sha256 message: $(cat "$WORK/err")"
[ ! -e "$REPO_DIR/blobs/$SHA" ] && [ ! -e "$REPO_DIR/blobs/$SHA.incomplete" ] ||
    fail "a corrupt download was kept"
[ ! -e "$REPO_DIR/snapshots/$COMMIT/tiny-Q8_0.gguf" ] || fail "a corrupt download was linked"
control corrupt=0

# Two pulls at once: one downloads, the other waits on the lock and finds the blob.
before=$(blob_gets "$SHA")
control slow=5
"$EMBER" pull test/tiny-GGUF:Q8_0 >"$WORK/a" 2>"$WORK/a.err" &
first=$!
"$EMBER" pull test/tiny-GGUF:Q8_0 >"$WORK/b" 2>"$WORK/b.err" || fail "concurrent pull b: $(cat "$WORK/b.err")"
wait $first || fail "concurrent pull a: $(cat "$WORK/a.err")"
control slow=0
cmp -s "$WORK/a" "$WORK/b" || fail "concurrent pulls printed different paths"
cmp -s "$(cat "$WORK/a")" "$MODEL" || fail "concurrent pulls: wrong bytes"
[ $(($(blob_gets "$SHA") - before)) -eq 1 ] || fail "concurrent pulls fetched the blob $(($(blob_gets "$SHA") - before)) times"
[ -z "$(ls "$REPO_DIR/blobs" | grep -v "^$SHA\$\|^$Q4_SHA\$")" ] || fail "stray files in blobs/: $(ls "$REPO_DIR/blobs")"
[ -e "$CACHE/.locks/models--test--tiny-GGUF/$SHA.lock" ] || fail "no lock file where huggingface_hub keeps them"

# A gated repository with the token: the redirect to another host does not carry it there.
path=$(HF_TOKEN=secret-token "$EMBER" pull test/gated-GGUF 2>"$WORK/err") || fail "gated pull: $(cat "$WORK/err")"
cmp -s "$path" "$MODEL" || fail "gated pull: wrong bytes"
grep '"/test/gated-GGUF/resolve/' "$LOG" | tail -1 | grep -q '"authorization":"Bearer secret-token"' ||
    fail "the token was not sent to the Hub"
grep "\"host\":\"localhost:$PORT\"" "$LOG" | grep -q '"authorization":"Bearer' && fail "the token went to the redirect's host"
"$EMBER" rm test/gated-GGUF >/dev/null || fail "rm gated"
path=$("$EMBER" pull --hf-token secret-token test/gated-GGUF:Q8_0 2>"$WORK/err") || fail "--hf-token: $(cat "$WORK/err")"

# A split model: every part pulled and linked, loaded as one, the tokens of the unsplit file.
want=$("$EMBER" run -m "$MODEL" --prompt-ids "1 450 4996" --temp 0 -n 16 --print-ids 2>/dev/null)
[ "$(echo "$want" | wc -w)" -eq 16 ] || fail "the unsplit model generated '$want'"
SPLIT_DIR=$CACHE/models--test--split-GGUF/snapshots/$(commit_of test/split-GGUF)/Q8_0
path=$("$EMBER" pull test/split-GGUF:Q8_0 2>"$WORK/err") || fail "split pull: $(cat "$WORK/err")"
[ "$path" = "$SPLIT_DIR/tiny-Q8_0-00001-of-00003.gguf" ] || fail "split pull path: $path"
for i in 1 2 3; do
    part=tiny-Q8_0-0000$i-of-00003.gguf
    cmp -s "$SPLIT_DIR/$part" "$HUB/test/split-GGUF/Q8_0/$part" || fail "split part $i: wrong bytes"
    case $(readlink "$SPLIT_DIR/$part") in ../../../blobs/*) ;; *) fail "part $i link: $(readlink "$SPLIT_DIR/$part")";; esac
done
got=$("$EMBER" run -m "$path" --prompt-ids "1 450 4996" --temp 0 -n 16 --print-ids 2>"$WORK/err") || fail "run split: $(cat "$WORK/err")"
[ "$got" = "$want" ] || fail "the pulled split model generated '$got', the unsplit '$want'"
got=$("$EMBER" run -m "$path" --no-mmap --prompt-ids "1 450 4996" --temp 0 -n 16 --print-ids 2>"$WORK/err") || fail "run split --no-mmap: $(cat "$WORK/err")"
[ "$got" = "$want" ] || fail "the split model read into memory generated '$got', the unsplit '$want'"
got=$("$EMBER" run --hf test/split-GGUF --prompt-ids "1 450 4996" --temp 0 -n 16 --print-ids 2>"$WORK/err") || fail "run --hf: $(cat "$WORK/err")"
[ "$got" = "$want" ] || fail "run --hf generated '$got', expected '$want'"
got=$("$EMBER" run --gguf "$HUB/test/split-GGUF/Q8_0/tiny-Q8_0-00001-of-00003.gguf" --prompt-ids "1 450 4996" --temp 0 -n 16 --print-ids 2>/dev/null)
[ "$got" = "$want" ] || fail "the local split model (--gguf) generated '$got', expected '$want'"
# A split model served is named after the model, not its first file.
"$EMBER" serve --gguf "$path" --port 0 >"$WORK/serve.log" 2>&1 &
serve_pid=$!
url=
for _ in $(seq 300); do
    url=$(sed -n 's|^ember serve: listening on \(http://[^ ]*\) .*|\1|p' "$WORK/serve.log")
    [ -n "$url" ] && break
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.1
done
models=$([ -n "$url" ] && curl -s "$url/v1/models")
kill "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null
case $models in *'"id":"tiny-Q8_0"'*) ;; *) fail "the served split model's id: $models $(tail -3 "$WORK/serve.log")";; esac
# The other commands that load a model take --hf and --gguf through the same helper.
printf 'Hello\n' | "$EMBER" chat --hf test/split-GGUF:Q8_0 --temp 0 -n 4 >"$WORK/chat" 2>"$WORK/err" ||
    fail "chat --hf: $(cat "$WORK/err")"
[ -s "$WORK/chat" ] || fail "chat --hf replied nothing"
"$EMBER" bench --hf test/split-GGUF --device cpu -t 2 --concurrency 1 -n 2 --prompt-tokens 8 --rounds 1 \
    >"$WORK/bench" 2>"$WORK/err" || fail "bench --hf: $(cat "$WORK/err")"
"$EMBER" bench --gguf "$MODEL" --device cpu -t 2 --concurrency 1 -n 2 --prompt-tokens 8 --rounds 1 \
    >"$WORK/bench2" 2>"$WORK/err" || fail "bench --gguf: $(cat "$WORK/err")"
grep -q "^concurrency=1 prompt_tokens=8 generated=2 " "$WORK/bench" || fail "bench --hf printed $(cat "$WORK/bench")"
grep -q "^concurrency=1 prompt_tokens=8 generated=2 " "$WORK/bench2" || fail "bench --gguf printed $(cat "$WORK/bench2")"
expect_error "is not a Hub model" "$EMBER" serve --hf nonsense --port 0
expect_error "test/missing: not found" "$EMBER" bench --hf test/missing
expect_error "open the first part" "$EMBER" run -m "$SPLIT_DIR/tiny-Q8_0-00002-of-00003.gguf" -p hi
rm "$SPLIT_DIR/tiny-Q8_0-00003-of-00003.gguf"
expect_error "part 3 of 3 of the split model" "$EMBER" run -m "$path" -p hi
expect_error "lacks part 3 of 3" env HF_HUB_OFFLINE=1 "$EMBER" pull test/split-GGUF

# A snapshot huggingface_hub laid out (made here by hand) is found without a download, online and offline.
OTHER=$WORK/other/hub/models--test--tiny-GGUF
mkdir -p "$OTHER/blobs" "$OTHER/snapshots/$COMMIT" "$OTHER/refs"
cp "$MODEL" "$OTHER/blobs/$SHA"
ln -s "../../blobs/$SHA" "$OTHER/snapshots/$COMMIT/tiny-Q8_0.gguf"
printf '%s' "$COMMIT" >"$OTHER/refs/main"
requests=$(wc -l <"$LOG")
path=$(HF_HOME=$WORK/other "$EMBER" pull test/tiny-GGUF:Q8_0 2>"$WORK/err") || fail "pull into the other cache: $(cat "$WORK/err")"
[ "$path" = "$OTHER/snapshots/$COMMIT/tiny-Q8_0.gguf" ] || fail "the other tool's snapshot was not used: $path"
tail -n +$((requests + 1)) "$LOG" | grep -q '/resolve/\|/_blobs/' && fail "a cached file was downloaded again"
path=$(HF_HOME=$WORK/other HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:1 "$EMBER" pull test/tiny-GGUF:Q8_0 2>"$WORK/err") ||
    fail "offline pull: $(cat "$WORK/err")"
[ "$path" = "$OTHER/snapshots/$COMMIT/tiny-Q8_0.gguf" ] || fail "offline pull: $path"
got=$(HF_HOME=$WORK/other HF_HUB_OFFLINE=1 "$EMBER" run --hf test/tiny-GGUF:Q8_0 --prompt-ids "1 450 4996" --temp 0 -n 16 --print-ids 2>/dev/null)
[ "$got" = "$want" ] || fail "offline run --hf generated '$got'"
expect_error "HF_HUB_OFFLINE is set" env HF_HOME=$WORK/other HF_HUB_OFFLINE=1 "$EMBER" pull test/split-GGUF
grep -q "not in the cache" "$WORK/err" || fail "offline miss: $(cat "$WORK/err")"
expect_error "has no .gguf model with the tag Q4_K_M" env HF_HOME=$WORK/other HF_HUB_OFFLINE=1 "$EMBER" pull test/tiny-GGUF:Q4_K_M
# The Hub unreachable: the cache still answers (with a warning).
path=$(HF_HOME=$WORK/other HF_ENDPOINT=http://127.0.0.1:1 "$EMBER" pull test/tiny-GGUF:Q8_0 2>"$WORK/err") ||
    fail "unreachable Hub with a cached model: $(cat "$WORK/err")"
grep -q "using the cached" "$WORK/err" || fail "no warning that the cache was used: $(cat "$WORK/err")"

# `ember list`: every repository of the cache with its size and models, whichever tool wrote it.
mkdir -p "$WORK/other/hub/models--someone--bert/blobs" "$WORK/other/hub/models--someone--bert/snapshots/$COMMIT"
head -c 3000 /dev/zero >"$WORK/other/hub/models--someone--bert/blobs/abc"
ln -s ../../blobs/abc "$WORK/other/hub/models--someone--bert/snapshots/$COMMIT/model.safetensors"
HF_HOME=$WORK/other "$EMBER" list >"$WORK/list" 2>"$WORK/err" || fail "list: $(cat "$WORK/err")"
grep -q "^someone/bert  *2.9 KiB$" "$WORK/list" || fail "list lacks someone/bert: $(cat "$WORK/list")"
grep -q "^test/tiny-GGUF  *9.3 MiB$" "$WORK/list" || fail "list lacks test/tiny-GGUF: $(cat "$WORK/list")"
grep -q "^  tiny-Q8_0.gguf  9.3 MiB$" "$WORK/list" || fail "list lacks tiny-Q8_0.gguf: $(cat "$WORK/list")"
"$EMBER" list >"$WORK/list" 2>/dev/null || fail "list"
grep -q "^  Q8_0/tiny-Q8_0-00001-of-00003.gguf (2 of 3 parts) " "$WORK/list" || fail "a set with a part removed: $(cat "$WORK/list")"
grep -q "^  tiny-Q4_K_M.gguf " "$WORK/list" || fail "list lacks the pulled Q4_K_M: $(cat "$WORK/list")"
HF_HOME=$WORK/empty "$EMBER" list >"$WORK/out" 2>"$WORK/err" || fail "list of an empty cache"
grep -q "no models in" "$WORK/err" || fail "empty list: $(cat "$WORK/err")"

# `ember rm`: a model's links go; a blob another link still uses stays; the last model takes the folder.
ln -s "../../blobs/$SHA" "$OTHER/snapshots/$COMMIT/alias-Q4_0.gguf"
HF_HOME=$WORK/other "$EMBER" rm test/tiny-GGUF:Q8_0 >"$WORK/out" || fail "rm :Q8_0"
[ ! -e "$OTHER/snapshots/$COMMIT/tiny-Q8_0.gguf" ] || fail "rm left the Q8_0 link"
[ -f "$OTHER/blobs/$SHA" ] || fail "rm removed a blob that alias-Q4_0.gguf still uses"
grep -q "removed test/tiny-GGUF:Q8_0 (0 B freed)" "$WORK/out" || fail "rm output: $(cat "$WORK/out")"
HF_HOME=$WORK/other "$EMBER" rm test/tiny-GGUF/alias-Q4_0.gguf >"$WORK/out" || fail "rm alias"
grep -q "(9.3 MiB freed)" "$WORK/out" || fail "rm output: $(cat "$WORK/out")"
[ ! -e "$OTHER" ] || fail "rm of the last model left $OTHER"
expect_error "test/tiny-GGUF is not in the cache" env HF_HOME=$WORK/other "$EMBER" rm test/tiny-GGUF
HF_HOME=$WORK/other "$EMBER" rm someone/bert >/dev/null || fail "rm a whole repository"
[ ! -e "$WORK/other/hub/models--someone--bert" ] || fail "rm someone/bert left its folder"
"$EMBER" rm test/tiny-GGUF:Q4_K_M >/dev/null || fail "rm Q4_K_M"
[ ! -e "$REPO_DIR/blobs/$Q4_SHA" ] && [ -e "$REPO_DIR/blobs/$SHA" ] || fail "rm Q4_K_M removed the wrong blob"
expect_error "no model in the cache matches test/tiny-GGUF:Q4_K_M" "$EMBER" rm test/tiny-GGUF:Q4_K_M

# A progress line on a terminal (bytes, rate, time left); `script` gives the pull one.
control slow=2
script -qec "'$EMBER' pull test/tiny-GGUF:Q4_K_M" /dev/null >"$WORK/tty" 2>&1 || fail "pull on a terminal: $(cat "$WORK/tty")"
control slow=0
grep -q "tiny-Q4_K_M.gguf: .* / .* MiB (100%), .*/s, .* left" "$WORK/tty" || fail "no progress line: $(cat "$WORK/tty")"

[ $fails -eq 0 ] && echo "pull: all checks passed"
exit $((fails > 0))
