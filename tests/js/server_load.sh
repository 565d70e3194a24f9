#!/usr/bin/env bash
# The issue's load test: 32 concurrent streaming clients for 60 s against `ember serve` on a tiny
# model; every answer must equal its greedy reference, the engine must be idle afterwards, and the
# server's resident memory must come back to its level after warm-up (within 10%).
#   bash server_load.sh EMBER_EXE FIXTURES_DIR BUILD_DIR [CLIENTS] [SECONDS]
# Run it on a sanitizer build (cmake -DEM_SANITIZE=ON) to check that it is ASan clean as well.
set -u
ember=$1 fixtures=$2 build=$3 clients=${4:-32} seconds=${5:-60}
here=$(cd "$(dirname "$0")" && pwd)
js=$(cd "$here/../js" && pwd)
work=$build/js-serve
mkdir -p "$work"
model=$work/tiny-llama.gguf
fail() { echo "FAIL: $*"; exit 1; }
command -v node >/dev/null || fail "node is needed"
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" -o "$model" >"$work/synth.log" 2>&1 ||
  fail "ember synth: $(tail -5 "$work/synth.log")"
log=$work/load.log
. "$here/../../tools/serve_lib.sh"
start_server "$log" "$ember" serve -m "$model" --port 0 --api-key sk-load --ctx 1024 --device cpu ||
  fail "ember serve did not start"
rss() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
cp "$js"/*.mjs "$work"/
# warm-up: one short round, so that allocator pools and the prefix cache reach their working size
node "$work/load.mjs" "$url" tiny-llama sk-load "$clients" 5 >/dev/null || fail "warm-up round failed"
before=$(rss)
node "$work/load.mjs" "$url" tiny-llama sk-load "$clients" "$seconds" || status=1
sleep 1
after=$(rss)
echo "resident memory: ${before} kB after warm-up, ${after} kB after the load"
# Under ASan, freed memory sits in its quarantine (up to 256 MB), so resident memory says nothing
# there; the leak check at exit (LeakSanitizer) is the memory check of a sanitizer build.
if ldd "$ember" 2>/dev/null | grep -q libasan; then
  echo "sanitizer build: memory checked by LeakSanitizer at exit instead of resident size"
elif [ "$after" -gt $((before + before / 10)) ]; then
  echo "FAIL: memory grew by more than 10%"; status=1
fi
kill -TERM "$pid"; wait "$pid"; rc=$?; trap - EXIT
[ $rc -eq 0 ] || { echo "FAIL: exit $rc after SIGTERM"; status=1; }
grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$log" && { echo "FAIL: sanitizer report"; status=1; }
exit ${status:-0}
