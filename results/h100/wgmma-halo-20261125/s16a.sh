#!/usr/bin/env bash
# Session 16, call 1 (two H100s): GPU0 the halo schedule's correctness (smoke, every shape,
# memcheck); GPU1 halo sweeps on the ResNet layer and AlexNet conv3-5 beside the persistent best.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-500}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-400 | head; pack; }
sw() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python gpu-out/halo_sweep.py "$@" > "$L/sweep-$name.log" 2>&1
  el "sweep $name rc=$?"; pack; }
C3=128,256,13,13,384,3,1,1,1; C4=128,384,13,13,384,3,1,1,2; C5=128,384,13,13,256,3,1,1,2
RL=64,64,56,56,64,3,1,1
export CUDA_VISIBLE_DEVICES=0
t smoke 120 --timeout 90 tests/test_gpu_pipelined.py -k "halo_schedule_writes"
if ! grep -q " passed" "$L/smoke.log" || grep -q "failed\|error" "$L/smoke.log"; then
  el "smoke failed"; grep -E "Error|assert|error" "$L/smoke.log" | head -30; tail -n 60 "$L/smoke.log" | cut -c1-300; pack; exit 0; fi
(
  export CUDA_VISIBLE_DEVICES=1
  sw fp16-resnet 110 wgmma-fp16 $RL 30
  sw tf32-resnet 70 wgmma $RL 16
  sw fp16-conv3 50 wgmma-fp16 $C3 10 relu
  sw fp16-conv4 50 wgmma-fp16 $C4 10 relu
  sw fp16-conv5 50 wgmma-fp16 $C5 10 relu
  sw tf32-conv3 50 wgmma $C3 8 relu
) > "$L/gpu1.log" 2>&1 &
t halo-tests 260 -n 8 --timeout 200 -k "halo" tests/test_gpu_pipelined.py
t memcheck-halo 120 --timeout 110 -k "memcheck and halo" tests/test_userkernel_gpu.py
wait
cat "$L/gpu1.log"
for f in "$L"/sweep-*.log; do echo "== $f"; sed -n '/--- best/,$p' "$f" | cut -c1-110; grep -c "ok=True" "$f"; grep "ok=False\|ERR" "$f" | head -3 | cut -c1-200; done
pack
