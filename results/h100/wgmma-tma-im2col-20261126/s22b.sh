#!/usr/bin/env bash
# Session 22, call 2 (one H100): the tuner on the layers the tma gather runs (fp16 and tf32
# classes, the shipped tiling among the candidates), then the fp16 class compared on what it
# stored.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s22b
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout "$(left 170)" python gpu-out/tune22.py wgmma-fp16 conv3 conv4 conv5 resnet vgg 1x1 s2 > "$L/tune-fp16.log" 2>&1; el "tune fp16 rc=$?"
timeout "$(left 150)" python gpu-out/tune22.py wgmma conv3 conv4 conv5 resnet vgg 1x1 > "$L/tune-tf32.log" 2>&1; el "tune tf32 rc=$?"
cp -r "$CONVLAB_CACHE_DIR" "$OUT/cache"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn)" "$L/$name.log" | cut -c1-110; }
K=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c alexnet-fp16 100 --kernels $K --model alexnet --batch 128
c resnet-fp16 45 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
c vgg-fp16 45 --kernels $K --layer 16,128,112,112,128,3,1,1 --batch 16
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
el done
grep -h "^TUNE" "$L"/tune-*.log | cut -c1-120
