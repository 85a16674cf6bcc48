#!/usr/bin/env bash
# Tune variants on AlexNet's conv layers at batch 128 (bias + ReLU, as the network runs them)
# and the ResNet-style 64->64 3x3 layer at batch 64 (plain, as `compare --layer` runs it), and
# AlexNet's FC layers as the channels-last variants run them (TUNE_DENSE_KERNELS).
# The choices land in the tuning cache ($CONVLAB_CACHE_DIR), where run and compare find them;
# each sweep is written as JSON under $1 (default ./tune-records). An empty TUNE_KERNELS or
# TUNE_DENSE_KERNELS skips that part.
# Usage: scripts/tune_layers.sh [DIR] (TUNE_KERNELS, TUNE_BUDGET: seconds per tiling)
set -uo pipefail
dir=${1:-tune-records}
mkdir -p "$dir"
convlab() { python3 -c "from convlab.cli import main; main()" "$@"; }
# tune FILE ARGS...: one sweep's JSON into FILE, written whole or not at all (a sweep stopped
# by a time limit leaves nothing half-written).
tune() {
  local file=$1; shift
  if convlab tune "$@" --budget "${TUNE_BUDGET:-0.2}" --json > "$file.part"; then
    mv "$file.part" "$file"
  else
    rm -f "$file.part"; echo "tune $* failed"
  fi
}
alexnet=(128,3,227,227,96,11,4,0,1 128,96,27,27,256,5,1,2,2 128,256,13,13,384,3,1,1,1
         128,384,13,13,384,3,1,1,2 128,384,13,13,256,3,1,1,2)
for kernel in ${TUNE_KERNELS-channels-last-fp16 channels-last channels-last-3xtf32}; do
  for layer in "${alexnet[@]}"; do
    tune "$dir/tune-$kernel-${layer//,/x}.json" --layer "$layer" --kernel "$kernel" --bias \
      --epilogue relu
  done
  tune "$dir/tune-$kernel-64x64x56x56x64x3x1x1.json" --layer 64,64,56,56,64,3,1,1 \
    --kernel "$kernel"
done
# AlexNet's FC layers as the channels-last variants run them: 1x1 convolutions of 1x1 images.
for kernel in ${TUNE_DENSE_KERNELS-channels-last-fp16 channels-last channels-last-3xtf32}; do
  for layer in 128,9216,1,1,4096,1:relu 128,4096,1,1,4096,1:relu 128,4096,1,1,1000,1:none; do
    epilogue=${layer#*:}; layer=${layer%:*}
    args=(); [[ $epilogue != none ]] && args=(--epilogue "$epilogue")
    tune "$dir/tune-$kernel-${layer//,/x}.json" --layer "$layer" --kernel "$kernel" --bias \
      "${args[@]}"
  done
done
