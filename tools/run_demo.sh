#!/usr/bin/env bash
# `make run`: start `ember serve` on the default model, send one chat request through the
# OpenAI-compatible API, print the model, the question and the answer as it streams (server-sent
# events, each token printed as it arrives), stop the server. The server's own log is shown only when
# something fails.
# Usage: tools/run_demo.sh EMBER MODEL.gguf
set -u
ember=$1 model=$2
question="What is a dog?"
. "$(dirname "$0")/serve_lib.sh"
log=$(mktemp)
start_server "$log" "$ember" serve -m "$model" --port 0 || exit 1
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
name=$(basename "$model" .gguf)
request='{"model":"'"$name"'","messages":[{"role":"user","content":"'"$question"'"}],"max_tokens":64,"temperature":0,"stream":true}'
echo "model: $name (a 21M-parameter model trained by the project on WordNet: models/README.md)"
echo "user: $question"
printf 'assistant: '
# Each event is a line `data: {chunk}`; the text is in choices[0].delta.content, and `data: [DONE]`
# ends the stream. An error arrives as a JSON body (or an event) with an "error" object.
curl -sS -N "$url/v1/chat/completions" -H 'content-type: application/json' -d "$request" | python3 -c '
import json, sys
answered = False
for line in iter(sys.stdin.readline, ""):
    line = line.strip()
    if not line:
        continue
    payload = line[len("data:"):].strip() if line.startswith("data:") else line
    if payload == "[DONE]":
        break
    try:
        event = json.loads(payload)
    except ValueError:
        continue
    if "error" in event:
        print("\nember: the server answered an error: " + json.dumps(event["error"]), file=sys.stderr)
        sys.exit(1)
    for choice in event.get("choices", []):
        text = (choice.get("delta") or {}).get("content")
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            answered = True
print()
sys.exit(0 if answered else 1)
' || { echo "ember: no answer came back; the server log:"; tail -n 20 "$log"; exit 1; }
