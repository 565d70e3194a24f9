#!/usr/bin/env bash
# The article's suite against two running servers, alternated round by round, with the report:
#   bench/compare_servers.sh EMBER_URL OTHER_URL [OUT_DIR] [more `ember bench --url` options]
# e.g. Ember against llama.cpp's server on the same GGUF, on one GPU machine:
#   build/ember serve -m MODEL.gguf --port 11435 --ctx 16384 --kv-sequences 16 &
#   llama-server -m MODEL.gguf --port 8080 -c 262144 -np 16 -ngl 99 &   # 16 slots of 16384 tokens
#   bench/compare_servers.sh http://127.0.0.1:11435 http://127.0.0.1:8080 bench/reports/dense-1b-bf16
# A random-weight model (ember synth) writes byte tokens whose invalid UTF-8 llama.cpp's server
# refuses mid-stream: add `--api completions --ban-tokens 3-258` (the llama-spm vocabulary's bytes).
# Both servers need room for 16 requests of a 300-token prompt plus 256 tokens at once, and for a
# 9,289-token prompt. Writes OUT_DIR/results.json and OUT_DIR/report.html (default: a dated folder
# under bench/reports) and prints the measurements as they come; figures go to bench/RESULTS.md with
# this command line and the commit.
set -eu
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 1; }
ember_url=$1 other_url=$2
out=${3:-bench/reports/$(date -u +%Y%m%d-%H%M%S)}
shift $(($# >= 3 ? 3 : 2))
root=$(cd "$(dirname "$0")/.." && pwd)
ember=${EMBER:-$root/build/ember}
[ -x "$ember" ] || { echo "no $ember: build it first (make)"; exit 1; }
for u in "$ember_url" "$other_url"; do
  curl -sf -o /dev/null "$u/v1/models" -H "Authorization: Bearer ${EMBER_API_KEY:-none}" ||
    { echo "$u/v1/models does not answer: is the server running?"; exit 1; }
done
"$ember" bench --url "$ember_url" --compare "$other_url" --concurrency 1,2,4,8,16 -n 256 --prompt-tokens 300 \
  --prefill 562,1971,8022,9289 --doc-tokens 8022 --rounds 3 --out "$out" "$@"
echo "report: $out/report.html"
