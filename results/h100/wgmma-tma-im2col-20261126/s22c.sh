#!/usr/bin/env bash
# Session 22, call 3 (one H100): the final tree with the shipped tunings (tma tilings on conv3-5,
# ResNet, VGG, the 1x1 and stride-2 layers): the tf32 class compared, the GPU smoke tier, the
# wgmma network tests and the tma tests alone.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s22c
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn-tf32|cudnn-nhwc-tf32)" "$L/$name.log" | cut -c1-110; }
K=wgmma,cudnn-tf32,cudnn-nhwc-tf32
c alexnet-tf32 100 --kernels $K --model alexnet --batch 128
c resnet-tf32 45 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
c vgg-tf32 45 --kernels $K --layer 16,128,112,112,128,3,1,1 --batch 16
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
  el "$name rc=$? $(tail -n 1 $L/$name.log)"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; }
t smoke 200 -m "gpu and smoke" -n 14 tests --ignore=tests/test_stream_gpu.py
t network 110 -n 4 tests/test_gpu.py -k "wgmma and (network or alexnet)"
t stream 60 tests/test_stream_gpu.py -m "gpu and smoke"
el done
