#!/usr/bin/env bash
# Session 22, call 6 (one H100): Nsight Compute on the tma gather against the cp.async one at
# the same tilings (conv3 and VGG in fp16, conv3 in tf32), and on the ResNet layer's new tiling
# against the halo one it replaced: what bounds each afterwards.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s22f PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-300}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
M="$(cat results/h100/session14-20261125/ncu/metrics.txt),lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes_read.sum,sm__cycles_active.avg,smsp__inst_executed.sum"
prof() { local name=$1 kernel=$2 layer=$3; shift 3
  local log="$L/ncu-$name.txt"
  timeout "$(left 50)" ncu --clock-control none --section SpeedOfLight --section WarpStateStats --metrics "$M" \
    -k regex:conv_forward -s 1 -c 1 python scripts/launch_layer.py --kernel "$kernel" --layer "$layer" "$@" > "$log" 2>&1
  el "$name rc=$? $(grep -E "gpu__time_duration.sum|gmma_cycles_active|lts__throughput.avg|issue_active|smsp__inst_executed.sum" "$log" | awk '{print $1, $NF}' | tr '\n' ' ')"; }
T() { echo "{\"bm\": $1, \"bn\": $2, \"bk\": $3, \"warps_m\": $(( $1 / 16 )), \"warps_n\": 1, \"stages\": $4, \"split_k\": 1, \"gather\": \"$5\", \"schedule\": \"$6\"${7:+, \"rows\": $7}}"; }
A=128,256,13,13,384,3,1,1
prof conv3-fp16-tap wgmma-fp16 $A --bias --config "$(T 128 256 64 4 tap persistent)"
prof conv3-fp16-tma wgmma-fp16 $A --bias --config "$(T 128 256 64 4 tma persistent)"
prof conv3-tf32-tap wgmma $A --bias --config "$(T 128 256 32 4 tap persistent)"
prof conv3-tf32-tma wgmma $A --bias --config "$(T 128 256 32 4 tma persistent)"
V=16,128,112,112,128,3,1,1
prof vgg-fp16-tap wgmma-fp16 $V --epilogue none --config "$(T 128 256 64 4 tap persistent)"
prof vgg-fp16-tma wgmma-fp16 $V --epilogue none --config "$(T 128 256 64 4 tma persistent)"
R=64,64,56,56,64,3,1,1
prof resnet-fp16-halo2 wgmma-fp16 $R --epilogue none --config "$(T 64 120 64 4 tap halo 2)"
prof resnet-fp16-tma wgmma-fp16 $R --epilogue none --config "$(T 64 128 64 4 tma persistent)"
el done
