#!/usr/bin/env bash
# The official OpenAI and Anthropic npm clients, plus raw HTTP checks, against a real `ember serve`
# on a synthetic tiny model: bash server_clients.sh EMBER_EXE FIXTURES_DIR BUILD_DIR.
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
js=$(cd "$here/../js" && pwd)
work=$build/js-serve
mkdir -p "$work"
model=$work/tiny-llama.gguf
fail() { echo "FAIL: $*"; exit 1; }

[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" -o "$model" >"$work/synth.log" 2>&1 ||
  fail "ember synth: $(tail -5 "$work/synth.log")"

log=$work/serve.log
. "$here/../../tools/serve_lib.sh"
# A KV size out of range is refused with a message naming the option.
out=$("$ember" serve -m "$model" --kv-sequences 0 2>&1) && fail "--kv-sequences 0 was accepted"
case $out in *"bad value for --kv-sequences"*) ;; *) fail "--kv-sequences 0: $out" ;; esac

start_server "$log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 256 --kv-sequences 6 --max-body 65536 \
  --device cpu || fail "ember serve did not start"

status=0
# The cache holds 6 sequences of 256 tokens: 96 blocks of 16, all free before any request.
metrics=$(curl -s "$url/metrics")
case $metrics in *"ember_kv_blocks_free 96"*) ;; *) echo "FAIL: /metrics with --kv-sequences 6: $(echo "$metrics" | grep kv_blocks)"; status=1 ;; esac
bash "$js/run.sh" "$url" tiny-llama sk-ember "$work" || status=1

# SIGTERM stops the server cleanly (exit 0), with nothing reported on the way out.
kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  kill -KILL "$pid"; echo "FAIL: ember serve did not stop within 10 s of SIGTERM"; status=1
fi
wait "$pid"
rc=$?
trap - EXIT
[ $rc -eq 0 ] || { echo "FAIL: ember serve exited $rc after SIGTERM"; status=1; }
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$log"; then
  echo "FAIL: sanitizer report in the server log:"; grep -A20 "ERROR\|runtime error" "$log" | head -40; status=1
fi
exit $status
