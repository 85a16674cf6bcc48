#!/usr/bin/env bash
# Session 15, call 3 (two H100s): GPU1 the compare records on the merged tune cache, then the
# parallel GPU suite; GPU0 the timer-sensitive shards alone (wgmma network runs, streams,
# compare tests) and memcheck on the persistent schedule.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
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
  c alexnet-tf32 100 --kernels $TF32 --model alexnet --batch 128
  c alexnet-fp16 100 --kernels $FP16 --model alexnet --batch 128
  c resnet 50 --kernels $FP32,$TF32,$FP16 --layer $RL --batch 64
  t parallel 300 -n 6 --timeout 240 -k "not network_reproduces and not alexnet and not compare" tests/test_gpu.py tests/test_gpu_general.py tests/test_gpu_pipelined.py tests/test_ops_gpu.py tests/test_imagenet.py tests/test_profile_gpu.py
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t network-wgmma 150 --timeout 120 -k "(network_reproduces or alexnet) and wgmma" tests/test_gpu.py
t memcheck-persistent 130 --timeout 120 -k "memcheck and (persistent or wgmma)" tests/test_userkernel_gpu.py
t compare-tests 100 -k compare tests/test_gpu.py
t stream-tests 170 tests/test_stream_gpu.py
wait
cat "$L/gpu1.log"
for f in alexnet-tf32 alexnet-fp16 resnet; do echo "== $f"; grep -E "^ +(128|64) +(wgmma|cudnn-nhwc)" "$L/$f.log" | cut -c1-130; done
pack
