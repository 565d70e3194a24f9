#!/usr/bin/env bash
# `ember bench --url` against real `ember serve` processes on a tiny model: the results of every
# section (bench_url_check.mjs checks the values), --warm-prompts, --compare with two servers,
# the Anthropic API, plain-text completions, the HTML report (well-formed, one chart per section, a line per server), and
# clear errors for an unreachable server, a non-200 answer, a malformed stream and a server failing
# mid-suite (what was measured before is kept).
# usage: bench_url.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$build/cli_bench_url
rm -rf "$work/out-"*
mkdir -p "$work"
status=0
fail() { echo "FAIL: $*"; status=1; }
command -v node >/dev/null || { echo "FAIL: node is needed (tools/deps.sh installs it)"; exit 1; }
command -v xmllint >/dev/null || { echo "FAIL: xmllint is needed (tools/deps.sh installs libxml2-utils)"; exit 1; }
model=$work/tiny-llama.gguf
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 -o "$model" \
  --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" >/dev/null 2>&1 || { echo "FAIL: synth"; exit 1; }

. "$here/../../tools/serve_lib.sh"
serve=("$ember" serve -m "$model" --port 0 --ctx 512 --kv-sequences 4 --device cpu --api-key sk-bench)
start_server "$work/serve1.log" "${serve[@]}" || exit 1
url1=$url pid1=$pid
start_server "$work/serve2.log" "${serve[@]}" || exit 1
url2=$url pid2=$pid
fake_pid=
trap 'kill $pid1 $pid2 $fake_pid 2>/dev/null; wait 2>/dev/null' EXIT
export EMBER_API_KEY=sk-bench
bench() { "$ember" bench "$@" 2>"$work/stderr"; }
check() { node "$here/bench_url_check.mjs" "$1/results.json" "$2" || fail "results.json of $2"; }
small=(--concurrency 1,3 -n 8 --prompt-tokens 50 --prefill 80,160 --doc-tokens 120)

# One server, every section.
out=$work/out-one/nested  # folders made as needed
bench --url "$url1" "${small[@]}" --rounds 1 --out "$out" >"$work/one.txt" || fail "bench --url: $(cat "$work/stderr")"
check "$out" one
grep -q "^server=0 clients=3 round=0 generated=24 " "$work/one.txt" || fail "progress lines: $(head -5 "$work/one.txt")"
# The report: well-formed, one section per chart, each with one chart and a line (or bars) per server.
html=$out/report.html
xmllint --noout "$html" 2>"$work/xmllint.txt" || fail "report.html is not well-formed: $(head -5 "$work/xmllint.txt")"
count() { xmllint --xpath "count($1)" "$html" 2>/dev/null; }
[ "$(count "//*[local-name()='section']")" = 4 ] || fail "report sections: $(count "//*[local-name()='section']")"
[ "$(count "//*[local-name()='section'][count(.//*[local-name()='svg'])=1]")" = 4 ] || fail "one chart per section"
for id in throughput slowest prefill; do
  [ "$(count "//*[@id='$id']//*[local-name()='polyline']")" = 1 ] || fail "$id: expected one line"
done
[ "$(count "//*[@id='switch']//*[local-name()='rect']")" = 5 ] || fail "switch: expected 5 bars"
grep -q "http\|src=" <<<"$(grep -o '<script[^>]*>\|<link[^>]*>\|src="[^"]*"' "$html")" && fail "report.html loads something"

# --report draws the same page again from results.json alone.
"$ember" bench --report "$out/results.json" --out "$work/out-again" || fail "--report"
cmp -s "$html" "$work/out-again/report.html" || fail "--report drew another page than the run"

# --warm-prompts: every prompt is in the cache before the measured requests.
bench --url "$url1" --concurrency 2 -n 4 --prompt-tokens 40 --rounds 1 --warm-prompts --sections concurrency \
  --out "$work/out-warm" >/dev/null || fail "--warm-prompts: $(cat "$work/stderr")"
check "$work/out-warm" warm

# --compare: two servers alternated round by round, both in the report on the same axes.
out=$work/out-compare
bench --url "$url1" --compare "$url2/" --concurrency 2 -n 4 --prompt-tokens 40 --prefill 60 --rounds 2 \
  --sections concurrency,prefill --out "$out" >/dev/null || fail "--compare: $(cat "$work/stderr")"
check "$out" compare
html=$out/report.html
for id in throughput slowest prefill; do
  [ "$(count "//*[@id='$id']//*[local-name()='polyline']")" = 2 ] || fail "compare $id: expected two lines"
done

# The Anthropic API.
bench --url "$url1" --api anthropic --prefill 70 --rounds 1 --sections prefill --out "$work/out-anthropic" \
  >/dev/null || fail "--api anthropic: $(cat "$work/stderr")"
check "$work/out-anthropic" anthropic

# Plain-text completions: the turns joined into one prompt, counted by the server's /tokenize
# (count_tokens counts a chat prompt) and the one request's usage that measures what it adds (BOS).
bench --url "$url1" --api completions --concurrency 2 -n 4 --prompt-tokens 40 --prefill 60 --doc-tokens 120 \
  --rounds 1 --out "$work/out-completions" >/dev/null || fail "--api completions: $(cat "$work/stderr")"
check "$work/out-completions" completions

# Errors: what went wrong and where.
expect_error() { # WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  bench "$@" >/dev/null && { fail "$what: accepted"; return; }
  grep -q -- "$pattern" "$work/stderr" || fail "$what: $(cat "$work/stderr")"
  grep -q "Sanitizer\|runtime error:" "$work/stderr" && fail "$what: a sanitizer report: $(head -30 "$work/stderr")"
}
expect_error "unreachable" "cannot reach http://127.0.0.1:1/v1/models" --url http://127.0.0.1:1
expect_error "bad URL" "starts with http://" --url 127.0.0.1:8080
expect_error "bad section" "unknown section 'speed'" --url "$url1" --sections speed
EMBER_API_KEY=wrong expect_error "wrong key" "answered HTTP 401 without a model id (invalid API key)" --url "$url1"
EMBER_API_KEY=wrong expect_error "wrong key, model named" "$url1 answered HTTP 401: invalid API key" --url "$url1" \
  --model tiny-llama --sections prefill --prefill 40
# A prompt longer than the server's context: the server's own 400 message.
expect_error "too long" "answered HTTP 400: .*context" --url "$url1" --sections prefill --prefill 600
# A llama.cpp-like server (fake_llama_server.mjs): prompts counted by /tokenize plus its template,
# prompt tokens read from its timings when it sends no usage; then one whose stream is not SSE JSON.
start_fake() { # MODE
  rm -f "$work/fake.txt"
  MODE=$1 node "$here/fake_llama_server.mjs" >"$work/fake.txt" &
  fake_pid=$!
  for _ in $(seq 100); do grep -qs "^http" "$work/fake.txt" && break; sleep 0.1; done
  fake=$(cat "$work/fake.txt")
}
start_fake llama
bench --url "$fake" --concurrency 2 -n 5 --prompt-tokens 40 --prefill 60 --doc-tokens 50 --rounds 1 \
  --out "$work/out-llama" >/dev/null || fail "against the llama.cpp-like server: $(cat "$work/stderr")"
check "$work/out-llama" llama
kill $fake_pid
start_fake usage
bench --url "$fake" --sections prefill --prefill 45,70 --rounds 1 --out "$work/out-usage" >/dev/null ||
  fail "against a server without a tokenizer endpoint: $(cat "$work/stderr")"
check "$work/out-usage" usage
kill $fake_pid
start_fake malformed
expect_error "malformed stream" "malformed stream from $fake: an event that is not a JSON object: '{not json}'" \
  --url "$fake" --sections prefill --prefill 9 --rounds 1
kill $fake_pid
# --ban-tokens: every generating request carries the logit bias (the fake refuses those without),
# and results.json records it; a malformed range is refused.
start_fake ban
bench --url "$fake" --ban-tokens 3-258 --concurrency 2 -n 3 --prompt-tokens 40 --prefill 60 --doc-tokens 50 --rounds 1 \
  --out "$work/out-ban" >/dev/null || fail "--ban-tokens: $(cat "$work/stderr")"
grep -q '"ban_tokens": "3-258"' "$work/out-ban/results.json" || fail "--ban-tokens not in results.json"
expect_error "without --ban-tokens" "no logit_bias for the byte tokens" --url "$fake" --sections prefill --prefill 9 --rounds 1
expect_error "bad --ban-tokens" "expects FROM-TO" --url "$fake" --ban-tokens 9-3
kill $fake_pid
# A server failing mid-suite: the error names it, and what was measured before is written.
start_fake late
rm -rf "$work/out-late"
expect_error "error mid-suite" "$fake reported an error mid-stream: parse failed" \
  --url "$fake" --concurrency 2 -n 3 --prompt-tokens 40 --prefill 60 --rounds 1 --out "$work/out-late"
grep -q "measurements made before the error are in $work/out-late" "$work/stderr" || fail "mid-suite: $(cat "$work/stderr")"
check "$work/out-late" late
kill $fake_pid

for log in "$work/serve1.log" "$work/serve2.log"; do
  if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$log"; then
    echo "FAIL: sanitizer report in $log:"; grep -A20 "ERROR\|runtime error" "$log" | head -40; status=1
  fi
done
exit $status
