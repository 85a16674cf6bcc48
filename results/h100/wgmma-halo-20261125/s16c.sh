#!/usr/bin/env bash
# Session 16, call 3 (two H100s): GPU0 the halo smoke, tunes where halo tilings compete, the
# ResNet and AlexNet fp16 compare records; GPU1 every halo GPU test, memcheck, and the fp32
# forward beside PyTorch's best (max-autotune included).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-500}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache/tune-cache.json "$OUT/records/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-400 | head; pack; }
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 14 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$?"; pack; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 --wide "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?"; pack; }
C4=128,384,13,13,384,3,1,1,2; RL=64,64,56,56,64,3,1,1
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
export CUDA_VISIBLE_DEVICES=0
t smoke 80 --timeout 60 tests/test_gpu_pipelined.py -k "halo_schedule_writes"
if ! grep -q " passed" "$L/smoke.log" || grep -q "failed\|error" "$L/smoke.log"; then
  el "smoke failed"; tail -n 60 "$L/smoke.log" | cut -c1-300; pack; exit 0; fi
(
  export CUDA_VISIBLE_DEVICES=1
  t halo-tests 150 -n 8 --timeout 120 -k "halo" tests/test_gpu_pipelined.py
  t memcheck-halo 60 --timeout 50 -k "memcheck and halo" tests/test_userkernel_gpu.py
  fwd fp32-pytorch 330 --kernel wgmma-3xtf32 --pytorch
) > "$L/gpu1.log" 2>&1 &
tune wgmma-resnet 90 --kernel wgmma --layer $RL
tune wgmma-fp16-resnet 90 --kernel wgmma-fp16 --layer $RL
tune wgmma-fp16-conv4 80 --kernel wgmma-fp16 --layer $C4 --bias --epilogue relu
c resnet 70 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
c alexnet-fp16 110 --kernels $FP16 --model alexnet --batch 128
wait
cat "$L/gpu1.log"
for f in "$L"/tune-*.log; do echo "== $f"; grep -E "halo| ws |best|fastest|kept" "$f" | cut -c1-150 | head -8; done
for f in resnet alexnet-fp16; do echo "== $f"; grep -E "^ +(128|64) +(wgmma|cudnn-nhwc)" "$L/$f.log" | cut -c1-130; done
grep -vE "^E1125|utotune|AUTOTUNE|triton_mm|^ *$|benchmarking|^\s+(triton|convolution|mm|addmm)" "$L/run-fp32-pytorch.log" | grep -E "nchw|nhwc|forward|PyTorch best|top-1" | cut -c1-130
pack
