#!/usr/bin/env bash
# Session 21, call 1 (one H100): the pingpong schedule's GPU tests, then it against the shipped
# tilings on AlexNet's layers, the ResNet and VGG 3x3 layers in each class; compute-sanitizer last.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21 PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout "$(left 170)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "pingpong or writes_fp16" > "$L/pingpong-tests.log" 2>&1
el "pingpong tests rc=$? $(tail -n 1 $L/pingpong-tests.log)"
grep -E "^(FAILED|ERROR)" "$L/pingpong-tests.log" | cut -c1-300 | head
timeout "$(left 300)" python gpu-out/pp.py 8 > "$L/pp.log" 2>&1; el "pp rc=$?"
grep -E "FAIL" "$L/pp.log" | head -5
timeout "$(left 200)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_userkernel_gpu.py -k "persistent_schedule" > "$L/memcheck.log" 2>&1
el "memcheck rc=$? $(tail -n 1 $L/memcheck.log)"
grep -E "^(FAILED|ERROR)" "$L/memcheck.log" | cut -c1-300 | head
grep -E "^BEST" "$L/pp.log" | cut -c1-150
