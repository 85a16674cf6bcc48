#!/usr/bin/env bash
# Session 17, call 4 (one H100): the final code on the tuned H100 tilings: compare records of
# AlexNet in fp32, fp16 and tf32 and of the ResNet layer, and the fp32 forward.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-300}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +(128|64) +(wgmma|cudnn-nhwc|cudnn )" "$L/$name.log" | cut -c1-50,110-135; pack; }
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 --wide "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?: $(grep -E '^forward|^top-1' "$L/run-$name.log" | tr -s ' ' | cut -c1-90 | tr '\n' ' ')"; pack; }
RL=64,64,56,56,64,3,1,1
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c alexnet-fp32 80 --kernels $FP32 --model alexnet --batch 128
c resnet 50 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
fwd fp32 30 --kernel wgmma-3xtf32
c alexnet-fp16 70 --kernels $FP16 --model alexnet --batch 128
c alexnet-tf32 70 --kernels $TF32 --model alexnet --batch 128
pack
