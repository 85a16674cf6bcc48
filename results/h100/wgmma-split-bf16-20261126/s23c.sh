#!/usr/bin/env bash
# Session 23, call 3 (one H100): wgmma-split-bf16 (3xTF32's cross products in BF16): its GPU
# tests, the same-sign margins of both fp32-class wgmma variants, the two on the same tilings,
# the tuner on it, and the fp32 class compared (3xTF32 on call 2's tuned tilings).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23c
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout "$(left 120)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "wgmma-split-bf16 or bf16_cross" > "$L/tests.log" 2>&1
el "split tests rc=$? $(tail -n 1 $L/tests.log)"
grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-250 | head -10
timeout "$(left 60)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -s tests/test_gpu_pipelined.py -k "keeps_same_sign or margin_on_same_sign" > "$L/same-sign.log" 2>&1
el "same-sign rc=$? $(tail -n 1 $L/same-sign.log)"; grep -E "same-sign" "$L/same-sign.log" | cut -c1-120
timeout "$(left 60)" python gpu-out/ab23b.py > "$L/ab.log" 2>&1; el "ab rc=$?"; grep "^AB" "$L/ab.log" | cut -c1-120
timeout "$(left 100)" python gpu-out/tune23.py wgmma-split-bf16 16 conv2 > "$L/tune-conv2.log" 2>&1; el "tune conv2 rc=$?"
timeout "$(left 130)" python gpu-out/tune23.py wgmma-split-bf16 6 conv3 conv4 conv5 resnet conv1 > "$L/tune-rest.log" 2>&1; el "tune rest rc=$?"
mkdir -p "$OUT/cache"; cp "$CONVLAB_CACHE_DIR"/tune*.json "$OUT/cache/" 2>/dev/null
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn) " "$L/$name.log" | cut -c1-110; }
K=wgmma-3xtf32,wgmma-split-bf16,cudnn,cudnn-nhwc
c alexnet-fp32 100 --kernels $K --model alexnet --batch 128
c resnet-fp32 35 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
el done
grep -h "^TUNE" "$L"/tune-*.log | grep -v "FAIL" | cut -c1-100 | head -40
grep -h "TUNE   FAIL" "$L"/tune-*.log | cut -c1-200 | head -5
