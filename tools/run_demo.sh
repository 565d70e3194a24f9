#!/usr/bin/env bash
# `make run`: start `ember serve` on the default model, send one chat request through the
# OpenAI-compatible API, print the reply, stop the server.
# Usage: tools/run_demo.sh EMBER MODEL.gguf
set -u
ember=$1 model=$2
log=$(mktemp)
"$ember" serve -m "$model" --port 0 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
url=
for _ in $(seq 1 300); do
  url=$(sed -n 's|^ember serve: listening on \(http://[^ ]*\) .*|\1|p' "$log")
  [ -n "$url" ] && break
  kill -0 $pid 2>/dev/null || { echo "ember serve exited:"; cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "ember serve did not start:"; cat "$log"; exit 1; }
name=$(basename "$model" .gguf)
request='{"model":"'"$name"'","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":32,"temperature":0}'
echo "POST $url/v1/chat/completions"
echo "$request"
echo
reply=$(curl -sS "$url/v1/chat/completions" -H 'content-type: application/json' -d "$request") || exit 1
echo "$reply"
echo
echo "assistant (a random tiny model, so random text):"
printf '%s\n' "$reply" | sed -n 's/.*"content":"\(\([^"\\]\|\\.\)*\)".*/\1/p'
