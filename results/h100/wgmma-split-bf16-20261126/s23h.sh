#!/usr/bin/env bash
# Session 23, call 8 (one H100): the final commit's GPU tests of the wgmma variants (the files
# edited last), then the smoke tier of every variant, timer-sensitive files apart.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23h
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-280}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"; git log --oneline -1 | tee -a "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
  el "$name rc=$? $(tail -n 1 $L/$name.log)"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-250 | head -8; }
t pipelined-wgmma 170 -n 14 tests/test_gpu_pipelined.py -k wgmma
t smoke 80 -m "gpu and smoke" -n 14 tests --ignore=tests/test_stream_gpu.py
el done
