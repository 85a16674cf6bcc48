#!/usr/bin/env bash
# Session 17, call 2 (two GPUs): GPU0 the smoke (new tests) then the GPU suite in parallel (less
# the timer-sensitive files); GPU1 3xTF32 tunes on the final code, the fp32 AlexNet and the
# ResNet compare records, the fp32 forward.
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
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 12 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$?"; grep -iE "best|fastest|kept" "$L/tune-$name.log" | cut -c1-150 | head -3; pack; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 --wide "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?: $(grep -E '^forward|^top-1' "$L/run-$name.log" | tr -s ' ' | tr '\n' ' ')"; pack; }
C1=128,3,227,227,96,11,4,0; C2=128,96,27,27,256,5,1,2,2; C3=128,256,13,13,384,3,1,1; RL=64,64,56,56,64,3,1,1
FP32=wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc
TF32=wgmma,cudnn-tf32,cudnn-nhwc-tf32
FP16=wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16
export CUDA_VISIBLE_DEVICES=0
t smoke 100 --timeout 90 tests/test_gpu_pipelined.py -k "partial_sums or resident_filters or same_sign or 3xtf32_passes or persistent_schedule_writes"
if tail -n 1 "$L/smoke.log" | grep -qE "failed|error|no tests"; then el "smoke failed"; tail -n 60 "$L/smoke.log" | cut -c1-300; pack; exit 0; fi
(
  export CUDA_VISIBLE_DEVICES=1
  tune 3xtf32-conv2 80 --kernel wgmma-3xtf32 --layer $C2 --bias --epilogue relu
  tune 3xtf32-conv3 70 --kernel wgmma-3xtf32 --layer $C3 --bias --epilogue relu
  tune 3xtf32-conv1 70 --kernel wgmma-3xtf32 --layer $C1 --bias --epilogue relu
  tune 3xtf32-resnet 60 --kernel wgmma-3xtf32 --layer $RL
  c alexnet-fp32 120 --kernels $FP32 --model alexnet --batch 128
  c resnet 80 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
  fwd fp32 40 --kernel wgmma-3xtf32
) > "$L/gpu1.log" 2>&1 &
t parallel 400 -n 12 --timeout 240 -k "not network_reproduces and not alexnet and not compare and not device_info_and_ceilings and not pytorch_candidates" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py tests/test_gpu_winograd.py tests/test_gpu_tuning.py tests/test_userkernel_gpu.py
wait
cat "$L/gpu1.log"
for f in alexnet-fp32 resnet; do echo "== $f"; grep -E "^ +(128|64) +(wgmma|cudnn-nhwc|cudnn )" "$L/$f.log" | cut -c1-130; done
pack
