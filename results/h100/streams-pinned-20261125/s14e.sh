#!/usr/bin/env bash
# Session 14, call 5 (one H100): wgmma TF32 without the in-place rounding of B: its tests, the
# TF32 compares (AlexNet, ResNet layer) against cuDNN in the same run, the forward pass.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-330}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
timeout "$(left 110)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 6 -k "wgmma and not fp16 and not bf16" \
  tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py > "$L/tests-wgmma-tf32.log" 2>&1
el "tests: $(tail -n 1 "$L/tests-wgmma-tf32.log")"; grep -E "^(FAILED|ERROR)" "$L/tests-wgmma-tf32.log" | cut -c1-250 | head; pack
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
timeout "$(left 100)" /tmp/cv compare --kernels $TF32 --model alexnet --batch 128 --budget 0.3 --save "$R" --wide > "$L/compare-alexnet-tf32.log" 2>&1
el "compare alexnet rc=$?"; pack
timeout "$(left 60)" /tmp/cv compare --kernels $TF32 --layer 64,64,56,56,64,3,1,1 --batch 64 --budget 0.3 --save "$R" --wide > "$L/compare-resnet-tf32.log" 2>&1
el "compare resnet rc=$?"; pack
timeout "$(left 50)" /tmp/cv run --model alexnet --kernel wgmma --batch 128 > "$L/run-wgmma.log" 2>&1
el "run rc=$? $(grep -E "forward pass|top-1|PASS|FAIL" "$L/run-wgmma.log" | tail -3 | tr '\n' ' ')"; pack
grep -E "^ +(128|64) +(wgmma|cudnn-nhwc-tf32|cudnn-tf32) " "$L"/compare-*-tf32.log | cut -c1-150
