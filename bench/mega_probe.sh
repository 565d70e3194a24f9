#!/usr/bin/env bash
# Why the persistent decode kernel (src/backend/cuda/mega.cu) streams slower than the per-operation
# kernels: Nsight Compute's view of one of its launches on a 6-layer cut of a model (throughput of
# memory and shared memory, warp stall reasons, the source lines the warps wait on, the sectors of
# local memory its spills move), then decode
# speed of the whole model under the kernel's knobs (stage size, 8-bit or f32 products) against the
# per-operation kernels, 256 greedy tokens after a 300-token prompt, one `ember run` each.
#
#   bench/mega_probe.sh BUILD_DIR VOCAB.gguf [preset:type ...]   (default: flint:mix moe-30b-a3b:mix)
set -u
build=$1 vocab=$2
shift 2
models=${*:-flint:mix moe-30b-a3b:mix}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prompt=$(seq 1000 1299 | tr '\n' ' ')
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
first=${models%% *}
if [ -n "$ncu" ] && "$build/ember" synth --preset "${first%%:*}" --layers 6 --type "${first##*:}" -o "$dir/cut.gguf" \
  --vocab "$vocab" >/dev/null; then
  EMBER_CUDA_MEGA=1 "$ncu" --clock-control none --print-details all --kernel-name regex:mega_kernel --launch-skip 30 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section SourceCounters \
    --metrics l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum \
    "$build/ember" run -m "$dir/cut.gguf" --prompt-ids "$prompt" -n 48 --temp 0 --device cuda 2>&1 | grep -v '^==PROF=='
else
  echo "no ncu (Nsight Compute) or no model: the profile is skipped"
fi
for m in $models; do
  "$build/ember" synth --preset "${m%%:*}" --type "${m##*:}" -o "$dir/m.gguf" --vocab "$vocab" >/dev/null || continue
  for knobs in "EMBER_CUDA_MEGA=0" "EMBER_CUDA_MEGA=1" "EMBER_CUDA_MEGA=1 EMBER_CUDA_MEGA_STAGE_KB=8" \
    "EMBER_CUDA_MEGA=1 EMBER_CUDA_MEGA_STAGE_KB=16" "EMBER_CUDA_MEGA=1 EMBER_CUDA_DP4A=0" \
    "EMBER_CUDA_MEGA=1 EMBER_CUDA_DP4A=0 EMBER_CUDA_MEGA_STAGE_KB=8"; do
    rate=$(env $knobs "$build/ember" run -m "$dir/m.gguf" --prompt-ids "$prompt" -n 256 --temp 0 --device cuda 2>&1 |
      sed -n 's/^decode: [0-9]* tokens, \([0-9.]*\) tok\/s/\1/p')
    printf '%-16s %-58s %s tok/s\n' "$m" "$knobs" "${rate:-failed}"
  done
done
