#!/usr/bin/env bash
# Returning to an evicted conversation on the CPU, against its cold prefill (issue 57's cycle at a
# small scale). `ember serve` with a KV pool that holds KEEP conversations of TOKENS token ids; CONVS
# conversations are sent in turn (cold: nothing cached), then each one's next turn (its prompt and
# 16 more ids) in the same order, so every return finds its conversation evicted from the pool and
# restores it from host RAM (a second round returns again: the RAM tier's host memory is then
# memory touched before, the first round's includes the kernel's first faults on it); then the
# server is restarted on the same --cache-dir and each
# conversation returns once more, from disk. Reported: the medians of the requests' own
# first_token_ms (submission to first token: the restore, at admission, included), with the tokens
# each path restored (timings.cache_ram_n, cache_disk_n) to show where they came from.
#
# Usage: bench/cache_tiers.sh EMBER MODEL.gguf (CONVS=6 KEEP=2 TOKENS=900 THREADS=2 in the environment)
set -u
ember=$1 model=$2
convs=${CONVS:-6} keep=${KEEP:-2} tokens=${TOKENS:-900} threads=${THREADS:-2}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../tools/serve_lib.sh"
work=$(mktemp -d)
serve() {
  start_server "$work/serve.log" "$ember" serve -m "$model" --port 0 --device cpu --threads "$threads" \
    --ctx $((tokens + 64)) --kv-sequences "$keep" --cache-ram 1G --cache-dir "$work/cache" --cache-disk 1G || exit 1
}
# ids I EXTRA: conversation I's prompt, with EXTRA more ids (its next turn)
ids() { awk -v s="$1" -v n=$((tokens + $2)) 'BEGIN { srand(s); printf "["; for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", 100 + int(rand() * 3900); printf "]" }'; }
ask() { curl -s "$url/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\":\"x\",\"prompt\":$(ids "$1" "$2"),\"max_tokens\":1,\"temperature\":0}"; }
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
round() { # NAME EXTRA: each conversation once; first_token_ms and restored tokens per line
  for i in $(seq "$convs"); do
    out=$(ask "$i" "$2")
    echo "$(field first_token_ms <<<"$out") $(field cached_tokens <<<"$out") $(field cache_ram_n <<<"$out") $(field cache_disk_n <<<"$out") $(field cache_restore_ms <<<"$out")"
  done >"$work/$1"
}
serve
round cold 0
round ram 16
round ram_again 24 # each conversation's second return: from RAM again, into host memory touched before
kill "$pid"; wait "$pid" 2>/dev/null
serve
round disk 40
kill "$pid"; wait "$pid" 2>/dev/null
cold=$(cut -d' ' -f1 "$work/cold" | median)
echo "| path | first token ms (median) | of cold | restore ms (median) | tokens cached, from RAM, from disk (median) |"
echo "|---|---|---|---|---|"
for r in cold ram ram_again disk; do
  ms=$(cut -d' ' -f1 "$work/$r" | median)
  printf '| %s | %.1f | %.3f | %.1f | %s, %s, %s |\n' "$r" "$ms" "$(awk -v a="$ms" -v b="$cold" 'BEGIN { print a / b }')" \
    "$(cut -d' ' -f5 "$work/$r" | median)" "$(cut -d' ' -f2 "$work/$r" | median)" "$(cut -d' ' -f3 "$work/$r" | median)" \
    "$(cut -d' ' -f4 "$work/$r" | median)"
done
rm -rf "$work"
