#!/usr/bin/env bash
# Session 20, call 8 (one H100): the GPU smoke tier on the final tree, then the wgmma tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-smoke
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout 300 python -m pytest -m "gpu and smoke" -q -p no:cacheprovider -rfE -n 14 tests > "$L/smoke.log" 2>&1; echo "smoke rc=$? $(tail -n 1 $L/smoke.log)"
grep -E "^(FAILED|ERROR)" "$L/smoke.log" | cut -c1-250 | head
timeout 220 python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k wgmma > "$L/wgmma.log" 2>&1; echo "wgmma rc=$? $(tail -n 1 $L/wgmma.log)"
grep -E "^(FAILED|ERROR)" "$L/wgmma.log" | cut -c1-250 | head
