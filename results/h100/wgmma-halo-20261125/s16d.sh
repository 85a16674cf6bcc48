#!/usr/bin/env bash
# Session 16, call 4 (two H100s): GPU0 the GPU suite in parallel (less the timer-sensitive
# files); GPU1 the timer-sensitive ones alone: wgmma network runs, the AlexNet forward in three
# classes on the tuned tilings, compare tests, kernel-file runs.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-500}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 --wide "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?: $(grep -E '^forward|^top-1' "$L/run-$name.log" | tr -s ' ' | tr '\n' ' ')"; pack; }
(
  export CUDA_VISIBLE_DEVICES=1
  t network-wgmma 140 --timeout 120 -k "(network_reproduces or alexnet) and wgmma" tests/test_gpu.py
  fwd fp16 40 --kernel wgmma-fp16
  fwd tf32 40 --kernel wgmma
  fwd fp32 40 --kernel wgmma-3xtf32
  t compare-tests 90 -k compare tests/test_gpu.py
  t kernelfile 120 --timeout 100 tests/test_kernelfile_runs_gpu.py
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t parallel 470 -n 12 --timeout 240 -k "not network_reproduces and not alexnet and not compare and not device_info_and_ceilings and not pytorch_candidates" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py tests/test_gpu_winograd.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
wait
cat "$L/gpu1.log"
pack
