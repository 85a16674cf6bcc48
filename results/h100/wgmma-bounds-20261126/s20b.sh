#!/usr/bin/env bash
# Session 20, call 2 (one H100): the persistent schedule's time with A's and/or B's copies
# skipped after the first stages (gpu-out/exp: HEAD plus SKIP_A / SKIP_B): what the copies cost.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-exp PYTHONPATH=$PWD/gpu-out/exp timeout 400 python gpu-out/bound_exp.py 2>&1 | tee "$L/bound.log" | grep -E "^BOUND|Error|error" | head -20

