#!/usr/bin/env bash
# Session 19, call 4 (one H100): the final code (the wgmma schedules' shared register store):
# the GPU suite in parallel (less the timer-sensitive tests), the wgmma network and AlexNet
# tests and the timer-sensitive ones alone, memcheck on the wgmma variants.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
SENSITIVE="network_reproduces or alexnet or compare or device_info_and_ceilings or pytorch_candidates or built_in_variants_still_pass"
t parallel 240 -n 14 --timeout 150 -k "not ($SENSITIVE)" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_gpu_depthwise.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py tests/test_gpu_winograd.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
t memcheck 90 --timeout 80 -k "memcheck_is_clean_on_every_shipped_variant and wgmma" tests/test_userkernel_gpu.py
t wgmma-alone 150 --timeout 120 -k "wgmma and (network_reproduces or alexnet)" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_ops_gpu.py
t alone 120 --timeout 100 -k "compare or built_in_variants_still_pass or device_info_and_ceilings" tests/test_gpu.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
el done
