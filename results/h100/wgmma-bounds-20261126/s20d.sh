#!/usr/bin/env bash
# Session 20, call 7 (one H100): wgmma-fp16 tuned again on the layers where the fp16-output
# A/B (call 5) had a persistent 3-stage tiling ahead of the shipped one (conv3, VGG), and on
# conv5 and the ResNet layer; then the fp16 class compared on what the tuner stored.
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
  el "tune $name rc=$? $(grep -E "^best|stopped" "$L/tune-$name.log" | cut -c1-150)"; grep -E "^ *[0-9]+ +bm=" "$L/tune-$name.log" | cut -c1-125 | sort -k12 -n | head -3; pack; }
c() { local name=$1 lim=$2; shift 2
  [[ $(left 60) -lt 30 ]] && return
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-nhwc|cudnn )" "$L/$name.log" | cut -c1-44; grep -iE "x cudnn|geomean|geometric" "$L/$name.log" | head -5; pack; }
tune conv3 80 --kernel wgmma-fp16 --layer 128,256,13,13,384,3,1,1 --bias --epilogue relu
tune vgg 80 --kernel wgmma-fp16 --layer 16,128,112,112,128,3,1,1
tune conv5 80 --kernel wgmma-fp16 --layer 128,384,13,13,256,3,1,1,2 --bias --epilogue relu
tune resnet 80 --kernel wgmma-fp16 --layer 64,64,56,56,64,3,1,1
K=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c alexnet 90 --kernels $K --model alexnet --batch 128
c resnet 40 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
c vgg 40 --kernels $K --layer 16,128,112,112,128,3,1,1 --batch 16
el done
