#!/usr/bin/env bash
# Session 22, call 5 (one H100): the final tree's shipped tunings on the other common shapes the
# tma gather runs (the 1x1 and stride-2 layers, fp16 and tf32 classes, cuDNN's rows beside),
# and the whole AlexNet forward in fp16 and tf32 (top-1 against float64).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s22e
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-300}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-(nhwc-)?(tf32|fp16))" "$L/$name.log" | cut -c1-110; }
K=wgmma,wgmma-fp16,cudnn-tf32,cudnn-nhwc-tf32,cudnn-fp16,cudnn-nhwc-fp16
c 1x1 60 --kernels $K --layer 64,256,56,56,64,1 --batch 64
c s2 60 --kernels $K --layer 64,64,56,56,128,3,2,1 --batch 64
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?"; grep -E "^(forward|top-1)" "$L/run-$name.log" | cut -c1-110; }
fwd fp16 45 --kernel wgmma-fp16
fwd tf32 45 --kernel wgmma
el done
