#!/usr/bin/env bash
# Session 21, call 9 (one H100): the fp16 register store in 16-byte vectors: its GPU tests and
# compute-sanitizer, then HEAD's element stores against it on the same tilings, twice each.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
export CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21g
timeout "$(left 200)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "register_store or writes_fp16 or wgmma-fp16" > "$L/store-tests.log" 2>&1
el "store tests rc=$? $(tail -n 1 $L/store-tests.log)"
grep -E "^(FAILED|ERROR)" "$L/store-tests.log" | cut -c1-300 | head
timeout "$(left 100)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_userkernel_gpu.py -k "(persistent_schedule or halo_schedule) and fp16" > "$L/memcheck.log" 2>&1
el "memcheck rc=$? $(tail -n 1 $L/memcheck.log)"
grep -E "^(FAILED|ERROR)" "$L/memcheck.log" | cut -c1-300 | head
for pass in 1 2; do
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-base PYTHONPATH=$PWD/gpu-out/base timeout "$(left 80)" python gpu-out/ab21.py base >> "$L/ab.log" 2>&1; el "base pass $pass rc=$?"
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-new PYTHONPATH=$PWD timeout "$(left 80)" python gpu-out/ab21.py new >> "$L/ab.log" 2>&1; el "new pass $pass rc=$?"
done
grep -E "^AB (base|new) " "$L/ab.log" | sort -k3,3 -k4,7 -s | cut -c1-100
