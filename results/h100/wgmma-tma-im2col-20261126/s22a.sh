#!/usr/bin/env bash
# Session 22, call 1 (one H100): the copy engine's im2col gather ("tma"): its GPU tests (bits
# equal to the cp.async gather's, float64, the persistent schedule's tests), compute-sanitizer,
# then tap against tma on the same tilings in the tuner's timing.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a "$L/gpus.log"
export CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s22a
timeout "$(left 240)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "tma or persistent_schedule" > "$L/tma-tests.log" 2>&1
el "tma tests rc=$? $(tail -n 1 $L/tma-tests.log)"
grep -E "^(FAILED|ERROR)" "$L/tma-tests.log" | cut -c1-400 | head -20
grep -E "Error|error" "$L/tma-tests.log" | sort | uniq -c | sort -rn | head -5 | cut -c1-300
timeout "$(left 90)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 3 tests/test_userkernel_gpu.py -k "tma_gather" > "$L/memcheck.log" 2>&1
el "memcheck rc=$? $(tail -n 1 $L/memcheck.log)"
grep -E "^(FAILED|ERROR)" "$L/memcheck.log" | cut -c1-300 | head
CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-ab22 timeout "$(left 200)" python gpu-out/ab22.py p1 > "$L/ab.log" 2>&1; el "ab rc=$?"
tail -n 3 "$L/ab.log" | grep -v "^AB" | cut -c1-300
el done
grep -E "^AB " "$L/ab.log" | cut -c1-110
