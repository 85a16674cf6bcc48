#!/usr/bin/env bash
# Session 21, call 3 (one H100): SM clock and power while our kernels, cuDNN's and the wgmma
# ceiling run back to back (gpu-out/clocks.py).
set -uo pipefail
export PYTHONUNBUFFERED=1 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21c PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
nvidia-smi -q -d CLOCK,POWER > "$L/smi-q.log" 2>&1
grep -E "Max Clocks|SM  |Power Limit|Current Power" -A0 "$L/smi-q.log" | head -12
timeout 300 python gpu-out/clocks.py > "$L/clocks.log" 2>&1; echo "clocks rc=$?"
cat "$L/clocks.log" | cut -c1-190 | tail -15
