#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU, sized to finish in under 8 minutes:
# training throughput for 32-true, 16-mixed, 16-mixed + channels_last, torch.compile, and a
# 1-GPU DDP run, printed as a Markdown table. Run from the repository root after `make install`:
#   bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
[ -d data/demo ] || "$PY" -m project.data.demo data/demo
timeout 450 "$PY" -m benchmarks.gpu_throughput --data data/demo --image-size 224 --batch-size 128 \
  --steps 60 --warmup 15
