#!/usr/bin/env bash
# Session 23, call 4 (one H100): the final tree with its shipped tunings: config_for's picks,
# the split-bf16 and 3xTF32 accuracy tests (same-sign, constant data, layouts), the GPU smoke
# tier, the fp32 class compared (AlexNet, ResNet, VGG, stride 2) and the fp32 AlexNet forward.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23d
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
python gpu-out/picked23.py 2>&1 | tail -5
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
  el "$name rc=$? $(tail -n 1 $L/$name.log)"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-250 | head -8; }
t split 80 -n 14 tests/test_gpu_pipelined.py -k "wgmma-split-bf16 or bf16_cross"
t margins 60 -s tests/test_gpu_pipelined.py -k "constant_data or keeps_same_sign"
grep -hE "same-sign|constant data" "$L/margins.log" | cut -c1-100
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; grep -E "^ +[0-9]+ +(wgmma|cudnn|cudnn-nhwc) " "$L/$name.log" | cut -c1-110; }
K=wgmma-3xtf32,wgmma-split-bf16,cudnn,cudnn-nhwc
c alexnet-fp32 100 --kernels $K --model alexnet --batch 128
c resnet-fp32 35 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
c vgg-fp32 40 --kernels $K --layer 16,128,112,112,128,3,1,1 --batch 16
c s2-fp32 30 --kernels $K --layer 64,64,56,56,128,3,2,1 --batch 64
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?"; grep -E "^(forward|top-1)" "$L/run-$name.log" | cut -c1-110; }
fwd fp32 40 --kernel wgmma-3xtf32
fwd fp32-split 40 --kernel wgmma-split-bf16 --fallback wgmma-3xtf32
t smoke 170 -m "gpu and smoke" -n 14 tests --ignore=tests/test_stream_gpu.py
el done
