#!/usr/bin/env bash
# Session 17, call 5 (one GPU): the final code: the GPU suite in parallel (less the
# timer-sensitive files), memcheck on the wgmma variants, an fp16 AlexNet run (per-layer GB/s
# now 16-bit).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-280}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
t parallel 200 -n 14 --timeout 150 -k "not network_reproduces and not alexnet and not compare and not device_info_and_ceilings and not pytorch_candidates and not built_in_variants_still_pass" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py tests/test_gpu_winograd.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
t memcheck-wgmma 50 --timeout 45 -k "memcheck and wgmma" tests/test_userkernel_gpu.py
timeout "$(left 25)" /tmp/cv run --model alexnet --batch 128 --kernel wgmma-fp16 > "$L/run-fp16.log" 2>&1
el "run fp16 rc=$?"; grep -E "conv|forward|top-1" "$L/run-fp16.log" | head -12 | cut -c1-110
pack
