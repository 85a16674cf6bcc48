#!/usr/bin/env bash
# Session 23, call 5 (one H100): compute-sanitizer memcheck on wgmma-split-bf16 (and the other
# persistent-schedule variants), the smoke tier with the split variant's smoke test, and the
# 3xTF32 / split tests of test_gpu_pipelined.py once more on the final tree.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23e
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-400}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
  el "$name rc=$? $(tail -n 1 $L/$name.log)"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-250 | head -8; }
t memcheck 150 -n 6 tests/test_userkernel_gpu.py -k "memcheck_is_clean_on_every_shipped_variant or memcheck_is_clean_on_the_persistent_schedule"
t smoke 150 -m "gpu and smoke" -n 14 tests --ignore=tests/test_stream_gpu.py
t fp32 150 -n 14 tests/test_gpu_pipelined.py -k "3xtf32 or wgmma-split-bf16 or bf16_cross"
el done
