#!/usr/bin/env bash
# Device time per kernel over two decode steps (Nsight Compute), the profile behind the CUDA
# sections of bench/RESULTS.md: `check_cuda --bench` runs a 300-token prefill then greedy steps;
# after SKIP launches, COUNT launches are timed one by one (graphs off, so each kernel is a launch),
# and the table sums them per kernel and grid, per decoded token (TOKENS tokens in COUNT launches).
#
# With SEQS, the decode steps are batches of SEQS sequences (`check_cuda --bench SEQS`; the prompts
# take SEQS times the launches to skip).
#
#   bench/cuda_profile.sh BUILD_DIR MODEL.gguf SKIP COUNT TOKENS [SEQS]
#   e.g. dense-1b (16 layers, ~98 launches per step): 1500 196 2; moe-30b-a3b --layers 4: 600 92 2
set -u
build=$1 model=$2 skip=$3 count=$4 tokens=$5 seqs=${6:-1}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu (Nsight Compute) not found"; exit 1; }
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
EMBER_CUDA_GRAPHS=0 "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
  --launch-skip "$skip" --launch-count "$count" --csv "$build/tests/check_cuda" "$model" x x --bench "$seqs" >"$csv" 2>/dev/null
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
    print("%8.1f us/token %6.1f launches/token %7.2f us each  %s" % (t / 1e3 / tokens, n / tokens, t / 1e3 / n, key))
print("sum %.1f us/token" % (total / 1e3 / tokens))
PY
