#!/usr/bin/env bash
# Session 21, call 13 (one H100): the fp16 class compared on the final tree (shipped tunings),
# then every kernel back to back with the clock sampled, ours and cuDNN's (clocks.py).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s21k
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma-fp16|cudnn-nhwc-fp16|cudnn-fp16)" "$L/$name.log" | cut -c1-110; }
K=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c alexnet 100 --kernels $K --model alexnet --batch 128
c resnet 45 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
c vgg 45 --kernels $K --layer 16,128,112,112,128,3,1,1 --batch 16
timeout "$(left 300)" python gpu-out/clocks.py fp16 > "$L/clocks.log" 2>&1; el "clocks rc=$?"
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
cut -c1-150 "$L/clocks.log" | grep -E "fp16|ceiling"
