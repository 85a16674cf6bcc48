#!/usr/bin/env bash
# Session 19, call 7 (one H100): the 1x1 and stride-2 layers of the survey in every class in
# one compare run each (their fp32 class had H200 figures only).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-final PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; rm -rf "$L" "$R"; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-300}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-nhwc|cudnn )" "$L/$name.log" | cut -c1-44; pack; }
K=wgmma-3xtf32,cudnn,cudnn-nhwc,wgmma,cudnn-tf32,cudnn-nhwc-tf32,wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
c one 80 --kernels $K --layer 64,256,56,56,64,1 --batch 64
c s2 80 --kernels $K --layer 64,64,56,56,128,3,2,1 --batch 64
el done
