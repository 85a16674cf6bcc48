#!/usr/bin/env bash
# Session 15, call 5 (two H100s), the final code (setmaxnreg out, blocks per SM counting
# registers): GPU0 the wgmma GPU tests, memcheck, the wgmma network tests alone, then the fp32
# compare; GPU1 the ResNet, fp16 and tf32 compare runs on the re-keyed tune cache.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-400}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
RL=64,64,56,56,64,3,1,1
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
(
  export CUDA_VISIBLE_DEVICES=1
  c resnet 45 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
  c alexnet-fp16 95 --kernels $FP16 --model alexnet --batch 128
  c alexnet-tf32 95 --kernels $TF32 --model alexnet --batch 128
  timeout "$(left 40)" /tmp/cv run --model alexnet --kernel wgmma-3xtf32 --batch 128 > "$L/run-alexnet-fp32.log" 2>&1
  el "run fp32: $(grep -E '^forward' "$L/run-alexnet-fp32.log")"; pack
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t wgmma-tests 90 -n 8 --timeout 80 -k "wgmma and not 3xtf32_margin" tests/test_gpu_pipelined.py
t memcheck 60 --timeout 60 -k "memcheck and (persistent or wgmma)" tests/test_userkernel_gpu.py
t network-wgmma 90 --timeout 80 -k "(network_reproduces or alexnet) and wgmma" tests/test_gpu.py
c alexnet-fp32 120 --kernels $FP32 --model alexnet --batch 128
wait
cat "$L/gpu1.log"
for f in alexnet-fp32 alexnet-tf32 alexnet-fp16 resnet; do echo "== $f"; grep -E "^ +(128|64) +(wgmma|channels|cudnn-nhwc)" "$L/$f.log" | cut -c1-118; done
pack
