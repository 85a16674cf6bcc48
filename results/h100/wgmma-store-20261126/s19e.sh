#!/usr/bin/env bash
# Session 19, call 5 (one H100): the final code on the shipped tilings: compare records of
# AlexNet (fp32, tf32, fp16 classes in one run), the ResNet 3x3, VGG 3x3 and 7x7 stem layers,
# and AlexNet's forward pass in each class.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-final PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  [[ $(left 60) -lt 30 ]] && return
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-nhwc|cudnn )" "$L/$name.log" | cut -c1-44,100-125; pack; }
fwd() { local name=$1 lim=$2; shift 2
  [[ $(left 60) -lt 30 ]] && return
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?: $(grep -iE 'forward|top-1' "$L/run-$name.log" | tr -s ' ' | cut -c1-100 | tr '\n' ' ')"; pack; }
K=wgmma-3xtf32,cudnn,cudnn-nhwc,wgmma,cudnn-tf32,cudnn-nhwc-tf32,wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c alexnet 170 --kernels $K --model alexnet --batch 128
c resnet 60 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
c vgg 60 --kernels $K --layer 16,128,112,112,128,3,1,1 --batch 16
c stem 70 --kernels $K --layer 64,3,224,224,64,7,2,3 --batch 64
fwd fp16 40 --kernel wgmma-fp16
fwd tf32 40 --kernel wgmma
fwd fp32 40 --kernel wgmma-3xtf32
el done
