#!/usr/bin/env bash
# `ember serve` with the prefix cache's lower tiers, on the project's model with plain curl:
#  - the start-up says what the tiers are;
#  - with a KV pool of two conversations, a third pushes the first to host RAM: its next request
#    reports the restored tokens in `timings` (cache_ram_n) and answers as before;
#  - stopped and started again on the same --cache-dir, the server finds the conversation on disk
#    (cache_disk_n) and gives the same answer;
#  - /metrics counts each tier's hits.
# usage: cache_tiers.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 build=$3
here=$(cd "$(dirname "$0")" && pwd)
model=$here/../../models/ember-wordnet-21m.Q4_K_M.gguf
work=$build/cli_cache_tiers
rm -rf "$work" && mkdir -p "$work"
status=0
fail() { echo "FAIL: $*"; status=1; }
has() { case $1 in *"$2"*) return 0 ;; esac; return 1; }
. "$here/../../tools/serve_lib.sh"

serve() { # LOG: the server on a pool of 2 x 128 positions, with both tiers
  start_server "$1" "$ember" serve -m "$model" --port 0 --device cpu --threads 2 --ctx 128 --kv-sequences 2 \
    --batch-tokens 512 --cache-ram 64M --cache-dir "$work/cache" --cache-disk 64M
}
# complete SEED: 100 token ids (a conversation's prompt) and 8 greedy tokens after them
complete() {
  local ids
  ids=$(awk -v s="$1" 'BEGIN { srand(s); printf "["; for (i = 0; i < 100; i++) printf "%s%d", i ? "," : "", 100 + int(rand() * 3900); printf "]" }')
  curl -s "$url/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"x\",\"prompt\":$ids,\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}"
}
text_of() { sed -n 's/.*"text":"\([^"]*\)".*/\1/p' <<<"$1"; }
number() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1"; }

serve "$work/serve1.log" || { echo "FAIL: ember serve did not start"; exit 1; }
grep -q "prefix cache tiers: host RAM 0.1 GiB, disk 0.1 GiB in $work/cache/[0-9a-f]*/slot-0" "$work/serve1.log" ||
  fail "the start-up line: $(grep 'prefix cache' "$work/serve1.log")"
first=$(complete 1)
complete 2 >/dev/null
complete 3 >/dev/null
complete 4 >/dev/null
again=$(complete 1)
[ "$(text_of "$again")" = "$(text_of "$first")" ] || fail "the answer after a restore from RAM: $again / $first"
[ "$(number "$again" cache_ram_n)" -gt 0 ] 2>/dev/null || fail "timings.cache_ram_n: $again"
metrics=$(curl -s "$url/metrics")
grep -q '^ember_cache_tier_hits_total{tier="ram"} [1-9]' <<<"$metrics" || fail "ram hits in /metrics"
kill "$pid" && wait "$pid" 2>/dev/null

serve "$work/serve2.log" || { echo "FAIL: ember serve did not start again"; exit 1; }
metrics=$(curl -s "$url/metrics")
grep -q '^ember_cache_tier_blocks{tier="disk"} [1-9]' <<<"$metrics" || fail "blocks on disk at the restart"
after=$(complete 1)
[ "$(text_of "$after")" = "$(text_of "$first")" ] || fail "the answer after a restart: $after / $first"
[ "$(number "$after" cache_disk_n)" -gt 0 ] 2>/dev/null || fail "timings.cache_disk_n after a restart: $after"
metrics=$(curl -s "$url/metrics")
grep -q '^ember_cache_tier_hits_total{tier="disk"} [1-9]' <<<"$metrics" || fail "disk hits in /metrics"
grep -q '^ember_cache_disk_files_skipped_total 0$' <<<"$metrics" || fail "files skipped at the restart"
[ $status = 0 ] && echo "ok: cache tiers under ember serve"
exit $status
