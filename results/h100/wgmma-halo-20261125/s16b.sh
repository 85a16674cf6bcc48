#!/usr/bin/env bash
# Session 16, call 2 (two H100s): GPU0 the halo patch-layout experiments (planes / 128-byte
# swizzle with and without the descriptor's base offset; 2 or 3 patch buffers); GPU1 the AlexNet
# forward at batch 128 beside PyTorch's best, now with torch.compile max-autotune.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-500}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
python -c "import torch, triton; print(torch.__version__, triton.__version__)" > "$L/versions.log" 2>&1; cat "$L/versions.log"
ex() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python gpu-out/halo_exp.py "$@" > "$L/exp-$name.log" 2>&1
  el "exp $name rc=$?"; cat "$L/exp-$name.log" | cut -c1-400; pack; }
fwd() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run --model alexnet --batch 128 --pytorch --wide "$@" > "$L/run-$name.log" 2>&1
  el "run $name rc=$?"; pack; }
RL=64,64,56,56,64,3,1,1; C4=128,384,13,13,384,3,1,1,2
(
  export CUDA_VISIBLE_DEVICES=1
  fwd fp16 200 --kernel wgmma-fp16
  fwd tf32 160 --kernel wgmma
  fwd fp32 160 --kernel wgmma-3xtf32
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
ex fp16-resnet 200 wgmma-fp16 $RL "64x176x64 4x1w s4 k1 tap halo3;64x120x64 4x1w s6 k1 tap halo2;64x232x64 4x1w s9 k1 tap halo4;64x232x64 4x1w s6 k1 tap halo4"
ex fp16-conv4 80 wgmma-fp16 $C4 "64x200x64 4x1w s6 k1 tap halo13;64x200x64 4x1w s3 k1 tap halo13" relu
ex tf32-resnet 80 wgmma $RL "64x232x32 4x1w s6 k1 tap halo4"
wait
cat "$L/gpu1.log"
for f in fp16 tf32 fp32; do echo "== $f"; grep -iE "end to end|forward|PyTorch|fastest|differ|top-1|autotune|error" "$L/run-$f.log" | cut -c1-150 | head -24; done
pack
