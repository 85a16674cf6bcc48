#!/usr/bin/env bash
# Session 21, call 8 (one H100): the stores as 16-byte vectors (values not transposed, timing only)
# against all and none (gpu-out/clocks_exp.py vector, on the experiment tree gpu-out/exp).
set -uo pipefail
export PYTHONUNBUFFERED=1 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21d
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
PYTHONPATH=$PWD/gpu-out/exp timeout 300 python gpu-out/clocks_exp.py vector > "$L/clocks-vector.log" 2>&1; echo "rc=$?"
cut -c1-170 "$L/clocks-vector.log" | tail -20
