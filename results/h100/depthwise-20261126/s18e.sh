#!/usr/bin/env bash
# Session 18, call 5 (one H100): the final code: the GPU suite in parallel (less the
# timer-sensitive tests), those of the depthwise variants and compare's alone, memcheck on the
# depthwise variants, and the depthwise survey on the final heuristic (untuned).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
cmp() { local name=$1 lim=$2 spec=$3 kernels=$4
  [[ $(left 60) -lt 25 ]] && return
  timeout "$(left "$lim")" /tmp/cv compare --layer "$spec" --kernels "$kernels" --budget 0.3 --batch "${spec%%,*}" --save "$R" > "$L/cmp-$name.log" 2>&1
  el "cmp $name rc=$?"; grep -E "^ +[0-9]+ +(depthwise|wgmma|cudnn-nhwc)" "$L/cmp-$name.log" | cut -c9-92; pack; }
SENSITIVE="network_reproduces or alexnet or compare or device_info_and_ceilings or pytorch_candidates or built_in_variants_still_pass"
t parallel 230 -n 14 --timeout 150 -k "not ($SENSITIVE)" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_gpu_depthwise.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py tests/test_gpu_winograd.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
t alone 130 --timeout 100 -k "depthwise or compare or built_in_variants_still_pass or device_info_and_ceilings" tests/test_gpu.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
DWK=depthwise,depthwise-fp16,depthwise-bf16
cmp dw 40 64,128,56,56,128,3,1,1,128 $DWK
cmp dw-s2 40 64,128,112,112,128,3,2,1,128 $DWK
cmp dw-7x7 50 64,96,56,56,96,7,1,3,96 $DWK
cmp dw-5x5 40 64,240,28,28,240,5,1,2,240 $DWK
cmp mb-144 40 64,144,56,56,144,3,1,1,144 $DWK
cmp mb-384 40 64,384,14,14,384,3,1,1,384 $DWK
cmp mb-960 40 64,960,7,7,960,3,1,1,960 $DWK
cmp ef-5x5-s2 40 64,144,56,56,144,5,2,2,144 $DWK
pack
el done
