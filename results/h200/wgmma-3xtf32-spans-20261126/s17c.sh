#!/usr/bin/env bash
# Session 17, call 3 (two GPUs), the final code: GPU0 the smoke, 3xTF32 tunes of conv1-2, the
# compare records of AlexNet in fp32, tf32 and fp16 and of the ResNet layer; GPU1 every 3xTF32
# GPU test, the timer-sensitive tests alone, the AlexNet forward in three classes.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-540}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache/tune-cache.json "$OUT/records/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-400 | head; pack; }
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 14 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$?"; grep -E "^best" "$L/tune-$name.log" | cut -c1-190; pack; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 --wide "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?: $(grep -E '^forward|^top-1' "$L/run-$name.log" | tr -s ' ' | cut -c1-90 | tr '\n' ' ')"; pack; }
C1=128,3,227,227,96,11,4,0; C2=128,96,27,27,256,5,1,2,2; RL=64,64,56,56,64,3,1,1
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
export CUDA_VISIBLE_DEVICES=0
t smoke 60 --timeout 50 tests/test_gpu_pipelined.py -k "same_sign and wgmma or persistent_schedule_writes"
if tail -n 1 "$L/smoke.log" | grep -qE "failed|error|no tests"; then el "smoke failed"; tail -n 60 "$L/smoke.log" | cut -c1-300; pack; exit 0; fi
(
  export CUDA_VISIBLE_DEVICES=1
  t fp32-class 130 -n 8 --timeout 120 -k "3xtf32 or FP32_CLASS or same_sign or fp32" tests/test_gpu.py tests/test_gpu_pipelined.py tests/test_gpu_general.py tests/test_userkernel_gpu.py
  t network-wgmma 130 --timeout 120 -k "(network_reproduces or alexnet) and wgmma" tests/test_gpu.py
  t alone 90 --timeout 80 -k "built_in_variants_still_pass or device_info_and_ceilings or compare" tests/test_gpu.py tests/test_userkernel_gpu.py
  fwd fp32 40 --kernel wgmma-3xtf32
  fwd tf32 40 --kernel wgmma
  fwd fp16 40 --kernel wgmma-fp16
) > "$L/gpu1.log" 2>&1 &
tune 3xtf32-conv1 70 --kernel wgmma-3xtf32 --layer $C1 --bias --epilogue relu
tune 3xtf32-conv2 80 --kernel wgmma-3xtf32 --layer $C2 --bias --epilogue relu
c alexnet-fp32 90 --kernels $FP32 --model alexnet --batch 128
c alexnet-tf32 80 --kernels $TF32 --model alexnet --batch 128
c alexnet-fp16 80 --kernels $FP16 --model alexnet --batch 128
c resnet 60 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
wait
cat "$L/gpu1.log"
for f in alexnet-fp32 alexnet-tf32 alexnet-fp16 resnet; do echo "== $f"; grep -E "^ +(128|64) +(wgmma|cudnn-nhwc|cudnn )" "$L/$f.log" | cut -c1-50,110-135; done
pack
