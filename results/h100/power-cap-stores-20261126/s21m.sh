#!/usr/bin/env bash
# Session 21, call 15 (one H100): pytest -m gpu on the final tree, sharded: the bulk under xdist
# (test_gpu less its network and compare tests), then the timer-sensitive files alone (stream,
# compare), then the network tests of the wgmma variants alone.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-full
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
run() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
  el "$name rc=$? $(tail -n 1 $L/$name.log)"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-250 | head -5; }
run bulk 300 -n 14 tests -k "not network_reproduces and not alexnet and not compare" --ignore=tests/test_stream_gpu.py
run stream 60 tests/test_stream_gpu.py
run compare 60 tests/test_gpu.py -k "compare"
run network-wgmma 150 -n 4 tests/test_gpu.py -k "(network_reproduces or alexnet) and wgmma"
