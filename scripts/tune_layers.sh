#!/usr/bin/env bash
# Tune variants on AlexNet's conv layers at batch 128 (bias + ReLU, as the network runs them)
# and the ResNet-style 64->64 3x3 layer at batch 64 (plain, as `compare --layer` runs it).
# The choices land in the tuning cache ($CONVLAB_CACHE_DIR), where run and compare find them;
# each sweep is written as JSON under $1 (default ./tune-records).
# Usage: scripts/tune_layers.sh [DIR] (TUNE_KERNELS, TUNE_BUDGET: seconds per tiling)
set -uo pipefail
dir=${1:-tune-records}
mkdir -p "$dir"
convlab() { python3 -c "from convlab.cli import main; main()" "$@"; }
alexnet=(128,3,227,227,96,11,4,0,1 128,96,27,27,256,5,1,2,2 128,256,13,13,384,3,1,1,1
         128,384,13,13,384,3,1,1,2 128,384,13,13,256,3,1,1,2)
for kernel in ${TUNE_KERNELS:-channels-last-fp16 channels-last channels-last-3xtf32}; do
  for layer in "${alexnet[@]}"; do
    convlab tune --layer "$layer" --kernel "$kernel" --bias --epilogue relu \
      --budget "${TUNE_BUDGET:-0.2}" --json > "$dir/tune-$kernel-${layer//,/x}.json" \
      || echo "tune $kernel $layer failed"
  done
  convlab tune --layer 64,64,56,56,64,3,1,1 --kernel "$kernel" --budget "${TUNE_BUDGET:-0.2}" \
    --json > "$dir/tune-$kernel-64x64x56x56x64x3x1x1.json" || echo "tune $kernel resnet failed"
done
