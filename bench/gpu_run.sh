#!/usr/bin/env bash
# The one prepared GPU run (well under 8 minutes on one GPU): the card's name,
# bench/gpu_check.py, then bench/gpu_step.py with short settings. Each output also goes
# to a file under $OUT when it is set (else under ${TMPDIR:-/tmp}/metricsync-gpu-run):
# card.txt, gpu_check.txt, gpu_step.txt. Exits non-zero if either script failed.
#
# Run from anywhere: bash bench/gpu_run.sh   (PYTHON=... picks the interpreter)
# Without CUDA both scripts run as CPU smoke tests (gpu_step with tiny sizes): a check
# of this script, whose timings say nothing about a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${OUT:-${TMPDIR:-/tmp}/metricsync-gpu-run}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo none)"
  "$py" -c 'import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU smoke test)"
print("torch", torch.__version__, "| torch.cuda.get_device_name():", name)'
} 2>&1 | tee "$out/card.txt"

if "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  step_args=(--steps 20 --warmup 2)  # 8 micro-batches, 2 layers of 256: about a minute
else
  step_args=(--steps 2 --warmup 1 --micro-batches 2 --d-model 16 --heads 2 --seq 16)
fi

status=0
timeout 300 "$py" bench/gpu_check.py 2>&1 | tee "$out/gpu_check.txt" || status=1
timeout 150 "$py" bench/gpu_step.py "${step_args[@]}" 2>&1 | tee "$out/gpu_step.txt" || status=1
echo "gpu_run: exit $status; outputs in $out"
exit "$status"
