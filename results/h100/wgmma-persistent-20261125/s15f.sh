#!/usr/bin/env bash
# Session 15, call 6 (two H100s), setmaxnreg back in: GPU1 the fp16 AlexNet compare; GPU0 the
# wgmma GPU tests, the fp32 AlexNet forward, memcheck on the persistent schedule.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-150}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
(
  export CUDA_VISIBLE_DEVICES=1
  timeout "$(left 120)" /tmp/cv compare --kernels wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16 --model alexnet --batch 128 --budget 0.3 --save "$R" --wide > "$L/alexnet-fp16.log" 2>&1
  el "alexnet-fp16 rc=$?"; pack
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t wgmma-tests 60 -n 8 --timeout 50 -k "persistent" tests/test_gpu_pipelined.py
timeout "$(left 35)" /tmp/cv run --model alexnet --kernel wgmma-3xtf32 --batch 128 > "$L/run-alexnet-fp32.log" 2>&1
el "run fp32: $(grep -E '^(forward|top-1)' "$L/run-alexnet-fp32.log" | tr '\n' ' ')"; pack
t memcheck 25 --timeout 25 -k "memcheck and persistent" tests/test_userkernel_gpu.py
wait
cat "$L/gpu1.log"
grep -E "^ +128 +(wgmma|cudnn-nhwc-fp16)" "$L/alexnet-fp16.log" | cut -c1-118
pack
