#!/usr/bin/env bash
# `make run`: start `ember serve` on the default model, send one chat request through the
# OpenAI-compatible API, print the reply, stop the server.
# Usage: tools/run_demo.sh EMBER MODEL.gguf
set -u
ember=$1 model=$2
. "$(dirname "$0")/serve_lib.sh"
log=$(mktemp)
start_server "$log" "$ember" serve -m "$model" --port 0 || exit 1
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
name=$(basename "$model" .gguf)
request='{"model":"'"$name"'","messages":[{"role":"user","content":"What is a dog?"}],"max_tokens":64,"temperature":0}'
echo "POST $url/v1/chat/completions"
echo "$request"
echo
reply=$(curl -sS "$url/v1/chat/completions" -H 'content-type: application/json' -d "$request") || exit 1
echo "$reply"
echo
echo "assistant ($name, a 21M-parameter model trained by the project on WordNet: models/README.md):"
printf '%s\n' "$reply" | sed -n 's/.*"content":"\(\([^"\\]\|\\.\)*\)".*/\1/p'
