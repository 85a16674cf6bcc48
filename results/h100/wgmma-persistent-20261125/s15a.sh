#!/usr/bin/env bash
# Session 15, call 1 (two H100s): GPU1 the wgmma GPU tests (persistent schedule first, with a
# hang guard); GPU0 the tuner over persistent + grid tilings, then compare runs.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache/tune-cache.json "$OUT/records/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.15 --jobs 12 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$?"; pack; }
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" --wide > "$L/$name.log" 2>&1
  el "$name rc=$?"; pack; }
C1=128,3,227,227,96,11,4,0,1; C2=128,96,27,27,256,5,1,2,2; C3=128,256,13,13,384,3,1,1,1
C4=128,384,13,13,384,3,1,1,2; C5=128,384,13,13,256,3,1,1,2; RL=64,64,56,56,64,3,1,1
export CUDA_VISIBLE_DEVICES=1
t smoke 90 --timeout 60 tests/test_gpu_pipelined.py -k "persistent_schedule_writes"
if ! grep -q " passed" "$L/smoke.log" || grep -q "failed\|error" "$L/smoke.log"; then
  el "smoke failed: stopping"; tail -n 40 "$L/smoke.log"; pack; exit 0; fi
(
  export CUDA_VISIBLE_DEVICES=1
  t wgmma-tests 330 -n 10 --timeout 240 -k "wgmma and not 3xtf32_margin" tests/test_gpu_pipelined.py
  for v in wgmma-3xtf32; do
    tune $v-resnet 50 --kernel $v --layer $RL
    tune $v-conv2 50 --kernel $v --layer $C2 --bias --epilogue relu
  done
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
for v in wgmma-fp16 wgmma; do
  tune $v-resnet 45 --kernel $v --layer $RL
  tune $v-conv3 45 --kernel $v --layer $C3 --bias --epilogue relu
done
c resnet 120 --kernels wgmma-3xtf32,channels-last-3xtf32,cudnn,cudnn-nhwc,wgmma,cudnn-tf32,cudnn-nhwc-tf32,wgmma-fp16,cudnn-fp16,cudnn-nhwc-fp16 --layer $RL --batch 64
for v in wgmma-fp16 wgmma; do
  tune $v-conv4 40 --kernel $v --layer $C4 --bias --epilogue relu
  tune $v-conv5 40 --kernel $v --layer $C5 --bias --epilogue relu
done
wait
cat "$L/gpu1.log"
for f in "$L"/tune-*.log; do echo "== $f"; grep -E " ws |PASS|best|fastest|kept" "$f" | cut -c1-160 | head -12; done
grep -E "^ +(64) +(wgmma|cudnn|channels)" "$L/resnet.log" | cut -c1-150
pack
