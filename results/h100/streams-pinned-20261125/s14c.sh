#!/usr/bin/env bash
# Session 14, call 3 (two H100s): issue 23's compare records, a class per run, two GPUs at once.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
RL=64,64,56,56,64,3,1,1
(
  export CUDA_VISIBLE_DEVICES=1
  c alexnet-tf32 200 --kernels $TF32 --model alexnet --batch 128
  c resnet 240 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
c alexnet-fp32 240 --kernels $FP32 --model alexnet --batch 128
c alexnet-fp16 200 --kernels $FP16 --model alexnet --batch 128
wait
cat "$L/gpu1.log"
for f in alexnet-fp32 alexnet-tf32 alexnet-fp16 resnet; do echo "== $f"; grep -E "^ +(layer|conv|128|64) " "$L/$f.log" | cut -c1-150 | head -40; done
pack
