#!/usr/bin/env bash
# Session 18, call 9 (one H100): a wider tiling sweep (40 tilings, tune's 16 plus) for
# wgmma-fp16 on AlexNet conv3 and the ResNet 3x3 layer (0.98x and 0.99x cuDNN in session 17),
# then compare on what it stored.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-480}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache/tune-cache.json "$R/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
for layer in conv3 resnet; do
  timeout "$(left 150)" python gpu-out/wide_tune.py wgmma-fp16 $layer > "$L/wide-$layer.log" 2>&1
  el "wide $layer rc=$?"; grep -v "^\s*$" "$L/wide-$layer.log" | grep -vi warn | tail -10; pack
done
timeout "$(left 90)" /tmp/cv compare --model alexnet --batch 128 --kernels wgmma-fp16 --budget 0.3 --save "$R" > "$L/cmp-alexnet-fp16.log" 2>&1
el "cmp alexnet rc=$?"; grep -E "^ +128 +(wgmma-fp16|cudnn-nhwc-fp16|cudnn-fp16) " "$L/cmp-alexnet-fp16.log" | cut -c9-100; pack
timeout "$(left 50)" /tmp/cv compare --layer 64,64,56,56,64,3,1,1 --kernels wgmma-fp16 --budget 0.3 --batch 64 --save "$R" > "$L/cmp-resnet-fp16.log" 2>&1
el "cmp resnet rc=$?"; grep -E "^ +64 +(wgmma-fp16|cudnn-nhwc-fp16|cudnn-fp16) " "$L/cmp-resnet-fp16.log" | cut -c9-100; pack
el done
