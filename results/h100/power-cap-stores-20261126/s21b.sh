#!/usr/bin/env bash
# Session 21, call 2 (one H100): the tuner, now offered pingpong tilings, on the AlexNet layers
# where call 1 had them ahead of the shipped tilings (TF32 conv1, 2, 4, 5; 3xTF32 conv5); then
# AlexNet compared in all three classes on what the tuner stored and the shipped tunings.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21b PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache-s21b/tune-cache.json "$R/tune-cache.json" 2>/dev/null; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 14 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$? $(grep -E "^best|stopped" "$L/tune-$name.log" | cut -c1-170)"; pack; }
c() { local name=$1 lim=$2; shift 2
  [[ $(left 60) -lt 30 ]] && return
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-nhwc|cudnn )" "$L/$name.log" | cut -c1-44; pack; }
A="--bias --epilogue relu"
tune tf32-conv5 75 --kernel wgmma --layer 128,384,13,13,256,3,1,1,2 $A
tune tf32-conv2 75 --kernel wgmma --layer 128,96,27,27,256,5,1,2,2 $A
tune tf32-conv4 75 --kernel wgmma --layer 128,384,13,13,384,3,1,1,2 $A
tune tf32-conv1 75 --kernel wgmma --layer 128,3,227,227,96,11,4 $A
tune fp32-conv5 75 --kernel wgmma-3xtf32 --layer 128,384,13,13,256,3,1,1,2 $A
c alexnet 150 --kernels wgmma,wgmma-3xtf32,wgmma-fp16,cudnn,cudnn-nhwc,cudnn-tf32,cudnn-nhwc-tf32,cudnn-fp16,cudnn-nhwc-fp16 --model alexnet --batch 128
grep -E "^ +128 +(wgmma)" "$L/alexnet.log" | cut -c1-110
el done
