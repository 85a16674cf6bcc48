#!/usr/bin/env bash
# Session 21, call 5 (one H100): session 20's copy switches with the SM clock sampled
# (gpu-out/clocks_exp.py on the experiment tree gpu-out/exp).
set -uo pipefail
export PYTHONUNBUFFERED=1 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21d
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
PYTHONPATH=$PWD/gpu-out/exp timeout 300 python gpu-out/clocks_exp.py > "$L/clocks-exp.log" 2>&1; echo "rc=$?"
cut -c1-170 "$L/clocks-exp.log" | tail -20
