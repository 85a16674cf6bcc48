#!/usr/bin/env bash
# Session 15, call 2 (two H100s): the tunes call 1 cut short, then one compare run per class
# (AlexNet at batch 128, the ResNet layer at batch 64) and the AlexNet forward passes.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache/tune-cache.json "$OUT/records/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 14 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$? $(tail -n 1 "$L/tune-$name.log" | cut -c1-120)"; pack; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
r() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run "$@" > "$L/$name.log" 2>&1
  el "$name rc=$? $(grep -iE "forward|end to end|Op Time" "$L/$name.log" | head -3 | tr '\n' ' ' | cut -c1-200)"; pack; }
C2=128,96,27,27,256,5,1,2,2; C3=128,256,13,13,384,3,1,1,1
C4=128,384,13,13,384,3,1,1,2; C5=128,384,13,13,256,3,1,1,2; RL=64,64,56,56,64,3,1,1
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
(
  export CUDA_VISIBLE_DEVICES=1
  tune wgmma-3xtf32-conv2 110 --kernel wgmma-3xtf32 --layer $C2 --bias --epilogue relu
  tune wgmma-3xtf32-conv3 100 --kernel wgmma-3xtf32 --layer $C3 --bias --epilogue relu
  c alexnet-fp32 130 --kernels $FP32 --model alexnet --batch 128
  c alexnet-tf32 110 --kernels $TF32 --model alexnet --batch 128
  r run-alexnet-fp32 45 --model alexnet --kernel wgmma-3xtf32 --batch 128
  r run-alexnet-tf32 40 --model alexnet --kernel wgmma --batch 128
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
tune wgmma-fp16-resnet 90 --kernel wgmma-fp16 --layer $RL
tune wgmma-resnet 90 --kernel wgmma --layer $RL
tune wgmma-fp16-conv4 75 --kernel wgmma-fp16 --layer $C4 --bias --epilogue relu
tune wgmma-fp16-conv5 75 --kernel wgmma-fp16 --layer $C5 --bias --epilogue relu
c resnet 60 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
c alexnet-fp16 110 --kernels $FP16 --model alexnet --batch 128
r run-alexnet-fp16 40 --model alexnet --kernel wgmma-fp16 --batch 128
wait
cat "$L/gpu1.log"
for f in alexnet-fp32 alexnet-tf32 alexnet-fp16 resnet; do echo "== $f"; grep -E "^ +(128|64) +(wgmma|cudnn|channels)" "$L/$f.log" | cut -c1-130; done
pack
