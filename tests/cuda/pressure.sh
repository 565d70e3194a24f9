#!/usr/bin/env bash
# Serving under memory pressure: `ember serve` with KV memory for KV_SEQUENCES conversations of CTX
# tokens while CLIENTS clients send long conversations and switch between them (pressure.py):
# every request completes with its greedy answer from alone (near-ties excepted), nothing fails.
#   tests/cuda/pressure.sh EMBER MODEL DEVICE [CLIENTS=32] [DOC_WORDS=7900] [CTX=10240] [KV_SEQUENCES=4] [TURNS=2] [TIE=0.05]
# The GPU run: a flint mix file and the defaults (conversations of about 8,000 tokens, the llama-spm
# vocabulary). TIE is a gap in log-probability; the kernels' stated bound for the file's types
# (tests/cuda/run.sh prints it) is relative to a row's largest logit, so the TIE it allows is that
# bound times the largest logit (the bound alone is stricter). make test runs it on the CPU with
# tiny-llama and short documents (tests/cli/serve_pressure.sh). The prefix cache's RAM tier is off
# (--cache-ram 0): it would turn evictions into restores and the pressure into none
# (tests/cli/cache_tiers.sh and tests/test_tiers.c test the tiers).
set -u
ember=$1 model=$2 device=$3 clients=${4:-32} words=${5:-7900} ctx=${6:-10240} kvseq=${7:-4} turns=${8:-2} tie=${9:-0.05}
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "FAIL: python3 is needed (tools/deps.sh installs it)"; exit 1; }
work=$(mktemp -d)
. "$here/../../tools/serve_lib.sh"
start_server "$work/serve.log" "$ember" serve -m "$model" --port 0 --api-key sk-pressure --alias m --device "$device" \
  --ctx "$ctx" --kv-sequences "$kvseq" --cache-ram 0 || exit 1
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
python3 "$here/pressure.py" "$url" m sk-pressure "$clients" "$words" "$turns" "$tie"
status=$?
kill -0 $pid 2>/dev/null || { echo "FAIL: ember serve is gone: $(tail -5 "$work/serve.log")"; status=1; }
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$work/serve.log"; then
  echo "FAIL: sanitizer report:"; grep -A20 "ERROR\|runtime error" "$work/serve.log" | head -40; status=1
fi
exit $status
