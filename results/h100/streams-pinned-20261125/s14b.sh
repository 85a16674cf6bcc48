#!/usr/bin/env bash
# Session 14, call 2 (two H100s): the rest of the GPU suite. GPU0: six xdist workers over the
# files without timer defences; GPU1: the timer-sensitive network shard, tuning, winograd alone.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-250 | head -20; pack; }
(
  export CUDA_VISIBLE_DEVICES=1
  t network 420 -k "network_reproduces or alexnet" tests/test_gpu.py
  t tuning 60 tests/test_gpu_tuning.py
  t winograd 100 tests/test_gpu_winograd.py
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t parallel 540 -n 6 --timeout 300 -k "not network_reproduces and not alexnet and not compare" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py
wait
cat "$L/gpu1.log"
pack
