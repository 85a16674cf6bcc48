#!/usr/bin/env bash
# Session 21, calls 6 and 7 (one H100; call 6 hit an illegal address, its slice running past the
# output, fixed for call 7): the stores kept but aimed at an L2-sized slice per block, against
# all and none (gpu-out/clocks_exp.py stores, on the experiment tree gpu-out/exp).
set -uo pipefail
export PYTHONUNBUFFERED=1 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21d
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
PYTHONPATH=$PWD/gpu-out/exp timeout 300 python gpu-out/clocks_exp.py stores > "$L/clocks-stores.log" 2>&1; echo "rc=$?"
cut -c1-170 "$L/clocks-stores.log" | tail -20
