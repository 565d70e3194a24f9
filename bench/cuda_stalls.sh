#!/usr/bin/env bash
# Why a decode kernel waits: Nsight Compute's warp-state (stall reasons), scheduler, occupancy and
# launch sections for the first COUNT launches of the kernels whose names match REGEX, in the
# decode steps of SEQS sequences that `check_cuda --bench SEQS` runs (as bench/cuda_profile.sh
# does: 5 prefill forwards per sequence, then decode steps; the two forwards profiled are decode
# steps 10 and 11). bench/cuda_profile.sh says where the time goes; this says what the slow kernels
# wait on (memory, the issue slots, shared memory, barriers) and how many warps they keep.
#
#   bench/cuda_stalls.sh BUILD_DIR MODEL.gguf SEQS REGEX [COUNT]
#   e.g. the IQ3_XXS expert products at 16 sequences: ... 16 'dq_kernel_iq3_one' 2
# REGEX meets the demangled name, template arguments included, as ncu writes them:
# 'dq_kernel<\(int\)14, \(int\)4,' is the Q6_K products of 4 items (14 = EM_TYPE_Q6_K).
set -u
[ $# -ge 4 ] || { echo "usage: bench/cuda_stalls.sh BUILD_DIR MODEL.gguf SEQS REGEX [COUNT]"; exit 2; }
build=$1 model=$2 seqs=$3 regex=$4 count=${5:-2}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu (Nsight Compute) not found"; exit 1; }
from=$((5 * seqs + 10))
# the stall reasons are the warp-state section's chart, which newer ncu prints with --print-details all
details=()
"$ncu" --help 2>/dev/null | grep -q -- '--print-details' && details=(--print-details all)
EMBER_CUDA_PROFILE="$from:$((from + 2))" "$ncu" --profile-from-start off --clock-control none "${details[@]}" \
  --kernel-name-base demangled --kernel-name "regex:$regex" --launch-count "$count" \
  --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
  "$build/tests/check_cuda" "$model" x x --bench "$seqs" 2>&1 |
  grep -v '^==PROF==' | grep -v '^\s*$'
