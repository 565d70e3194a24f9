#!/usr/bin/env bash
# The device a CUDA benchmark ran on and its copy bandwidth in the same run, for scale: the GPU's
# name, driver and memory, and a device-to-device copy (bytes read + written) when PyTorch is
# there. Run by bench/cuda.sh and bench/mega.sh.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
python3 - <<'PY' 2>/dev/null || echo "copy bandwidth: not measured (no PyTorch)"
import torch
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print("copy bandwidth: %.2f TB/s (read + write)" % (2 * 10 * a.numel() / (s.elapsed_time(e) / 1e3) / 1e12))
PY
