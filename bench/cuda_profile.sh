#!/usr/bin/env bash
# Device time per kernel over a few forwards (Nsight Compute), the profile behind the CUDA sections
# of bench/RESULTS.md: `check_cuda --bench SEQS` prefills SEQS sequences of 300 tokens (5 forwards
# each), then runs decode steps of SEQS tokens; forwards FROM..TO-1 (counted from 0) are profiled
# (EMBER_CUDA_PROFILE brackets them with cudaProfilerStart/Stop), and the table sums the kernels
# per name and grid, per step (STEPS steps in the range).
#
#   bench/cuda_profile.sh BUILD_DIR MODEL.gguf FROM TO STEPS [SEQS]
#   e.g. one sequence: 10 12 2; 16 sequences: 90 92 2 16
# SEQS may instead be `chunk:CTX:N`: `check_cuda --chunk CTX N` (a cold prefill of CTX tokens in
# forwards of 2048, then chunks of N tokens on it), e.g. the 41-token follow-up on 8022 tokens:
# 5 6 1 chunk:8022:41; the whole cold prefill: 0 4 1 chunk:8022:41
set -u
build=$1 model=$2 from=$3 to=$4 tokens=$5 seqs=${6:-1}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu (Nsight Compute) not found"; exit 1; }
case $seqs in chunk:*:*) IFS=: read -r _ ctx n <<<"$seqs"; mode="--chunk $ctx $n" ;; *) mode="--bench $seqs" ;; esac
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
EMBER_CUDA_PROFILE="$from:$to" "$ncu" --profile-from-start off --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum --csv "$build/tests/check_cuda" "$model" x x $mode >"$csv" 2>/dev/null
python3 - "$csv" "$tokens" <<'PY'
import collections, csv, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name_at, value_at, grid_at = head.index("Kernel Name"), head.index("Metric Value"), head.index("Grid Size")
per = collections.OrderedDict()
for r in rows:
    name = re.sub(r"<(.{0,60}).*", r"<\1>", re.sub(r"\(.*", "", r[name_at]).replace("void ", ""))
    key = name + " grid" + r[grid_at]
    n, t = per.get(key, (0, 0.0))
    per[key] = (n + 1, t + float(r[value_at].replace(",", "")))
tokens, total = float(sys.argv[2]), 0.0
for key, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    total += t
    print("%8.1f us/step %6.1f launches/step %7.2f us each  %s" % (t / 1e3 / tokens, n / tokens, t / 1e3 / n, key))
print("sum %.1f us/step" % (total / 1e3 / tokens))
PY
