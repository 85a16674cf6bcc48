#!/usr/bin/env bash
# Session 23, call 2 (one H100): wgmma-3xtf32 tuned with the grid schedule's spans (conv2 on
# all 16 of its candidates), then the fp32 class compared on what the tuner stored, and the
# 3xTF32 GPU tests on this tree.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23b
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout "$(left 130)" python gpu-out/tune23.py 16 conv2 > "$L/tune-conv2.log" 2>&1; el "tune conv2 rc=$?"
timeout "$(left 190)" python gpu-out/tune23.py 7 conv5 conv1 conv4 conv3 resnet > "$L/tune-rest.log" 2>&1; el "tune rest rc=$?"
mkdir -p "$OUT/cache"; cp "$CONVLAB_CACHE_DIR"/tune*.json "$OUT/cache/" 2>/dev/null
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn)" "$L/$name.log" | cut -c1-110; }
K=wgmma-3xtf32,cudnn,cudnn-nhwc
c alexnet-fp32 110 --kernels $K --model alexnet --batch 128
c resnet-fp32 40 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
timeout "$(left 90)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "3xtf32" > "$L/tests.log" 2>&1
el "3xtf32 tests rc=$? $(tail -n 1 $L/tests.log)"
grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | head -10
el done
grep -h "^TUNE" "$L"/tune-*.log | cut -c1-120
