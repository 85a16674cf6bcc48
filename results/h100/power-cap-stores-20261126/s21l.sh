#!/usr/bin/env bash
# Session 21, call 14 (one H100): the final fp16 store (16-byte path only where y starts on 16
# bytes): its GPU tests, memcheck, then HEAD against it on the three shipped tilings it changes
# (conv4, the 1x1, VGG) and conv3 in the tuner's timing and back to back.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-400}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
export CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21l
timeout "$(left 150)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "register_store or writes_fp16 or wgmma-fp16" > "$L/store-tests.log" 2>&1
el "store tests rc=$? $(tail -n 1 $L/store-tests.log)"
grep -E "^(FAILED|ERROR)" "$L/store-tests.log" | cut -c1-300 | head
timeout "$(left 60)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_userkernel_gpu.py -k "(persistent_schedule or halo_schedule) and fp16" > "$L/memcheck.log" 2>&1
el "memcheck rc=$? $(tail -n 1 $L/memcheck.log)"
CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-base PYTHONPATH=$PWD/gpu-out/base timeout "$(left 60)" python gpu-out/ab21.py base conv3 vgg conv4 1x1 >> "$L/ab.log" 2>&1; el "base rc=$?"
CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-new PYTHONPATH=$PWD timeout "$(left 60)" python gpu-out/ab21.py new conv3 vgg conv4 1x1 >> "$L/ab.log" 2>&1; el "new rc=$?"
CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-base PYTHONPATH=$PWD/gpu-out/base timeout "$(left 30)" python gpu-out/clocks_ab.py base >> "$L/clocks-ab.log" 2>&1
CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab-new PYTHONPATH=$PWD timeout "$(left 30)" python gpu-out/clocks_ab.py new >> "$L/clocks-ab.log" 2>&1
el done
grep -E "^AB (base|new) " "$L/ab.log" | sort -k3,3 -k4,7 -s | cut -c1-100
grep CAB "$L/clocks-ab.log"
