#!/usr/bin/env bash
# Session 23, call 6 (one H100): the final tree, all three classes in one compare run (AlexNet
# at batch 128, the ResNet layer at batch 64) against every cuDNN row, and Nsight Compute on
# the fp32 class's conv2 and conv3 (3xTF32 against the BF16 cross products, same tiling).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23f PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-420}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
c() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv compare "$@" --budget 0.3 --save "$R" > "$L/$name.log" 2>&1
  el "$name rc=$?"; }
K=wgmma,wgmma-fp16,wgmma-3xtf32,wgmma-split-bf16,cudnn,cudnn-nhwc,cudnn-tf32,cudnn-nhwc-tf32,cudnn-fp16,cudnn-nhwc-fp16
c alexnet-all 230 --kernels $K --model alexnet --batch 128
c resnet-all 70 --kernels $K --layer 64,64,56,56,64,3,1,1 --batch 64
tar -C "$OUT" -czf "$OUT/records.tar.gz" records && rm -rf "$R"
M="$(cat results/h100/session14-20261125/ncu/metrics.txt),lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,smsp__inst_executed.sum"
prof() { local name=$1 kernel=$2 layer=$3; shift 3
  local log="$L/ncu-$name.txt"
  timeout "$(left 40)" ncu --clock-control none --section SpeedOfLight --section WarpStateStats --metrics "$M" \
    -k regex:conv_forward -s 1 -c 1 python scripts/launch_layer.py --kernel "$kernel" --layer "$layer" "$@" > "$log" 2>&1
  el "$name rc=$? $(grep -E "gpu__time_duration.sum|gmma_cycles_active|issue_active|smsp__inst_executed.sum" "$log" | awk '{print $1, $NF}' | tr '\n' ' ')"; }
T() { echo "{\"bm\": $1, \"bn\": $2, \"bk\": 32, \"warps_m\": $(( $1 / 16 )), \"warps_n\": 1, \"stages\": $3, \"split_k\": 1, \"gather\": \"$4\", \"schedule\": \"persistent\"}"; }
prof conv2-3xtf32 wgmma-3xtf32 128,96,27,27,256,5,1,2,2 --bias --config "$(T 128 128 3 table)"
prof conv2-split wgmma-split-bf16 128,96,27,27,256,5,1,2,2 --bias --config "$(T 128 128 3 table)"
prof conv3-split wgmma-split-bf16 128,256,13,13,384,3,1,1 --bias --config "$(T 128 128 3 tap)"
el done
