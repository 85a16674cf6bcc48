#!/usr/bin/env bash
# Session 21, call 10 (one H100): HEAD's element stores against the 16-byte register store, back to
# back with the clock sampled (gpu-out/clocks_ab.py), twice each.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
for pass in 1 2; do
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-base PYTHONPATH=$PWD/gpu-out/base timeout 80 python gpu-out/clocks_ab.py base >> "$L/clocks-ab.log" 2>&1
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-new PYTHONPATH=$PWD timeout 80 python gpu-out/clocks_ab.py new >> "$L/clocks-ab.log" 2>&1
done
grep CAB "$L/clocks-ab.log"; grep -iE "error|Traceback" "$L/clocks-ab.log" | head -3
