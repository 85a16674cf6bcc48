#!/usr/bin/env bash
# Session 19, call 6 (one H100): wgmma-3xtf32 tuned on AlexNet conv2 on this GPU (calls 1
# and 3 had 128x96 s4 5-6% ahead of the shipped 128x128 s3 on two H100s), then AlexNet and
# the ResNet layer compared in every class on what the tuner stored.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-final PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache-final/tune-cache.json "$R/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 14 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$? $(grep -E "^best|stopped" "$L/tune-$name.log" | cut -c1-150)"; grep -E "^ *[0-9]+ +bm=" "$L/tune-$name.log" | cut -c1-125 | sort -k12 -n | head -4; pack; }
c() { local name=$1 lim=$2; shift 2
  [[ $(left 60) -lt 30 ]] && return
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-nhwc|cudnn )" "$L/$name.log" | cut -c1-44; pack; }
tune 3xtf32-conv2 110 --kernel wgmma-3xtf32 --layer 128,96,27,27,256,5,1,2,2 --bias --epilogue relu
K=wgmma-3xtf32,cudnn,cudnn-nhwc,wgmma,cudnn-tf32,cudnn-nhwc-tf32,wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c alexnet 170 --kernels $K --model alexnet --batch 128
c resnet 60 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
el done
