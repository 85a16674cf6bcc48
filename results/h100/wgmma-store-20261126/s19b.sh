#!/usr/bin/env bash
# Session 19, call 2 (one H100): Nsight Compute on the layers short of cuDNN, this tree.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-400}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
M="$(cat results/h100/session14-20261125/ncu/metrics.txt),lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes_read.sum,sm__cycles_active.avg,smsp__inst_executed.sum"
prof() { local name=$1 kernel=$2 layer=$3; shift 3
  local log="$L/ncu-$name.txt"
  timeout "$(left 80)" ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --metrics "$M" \
    -k regex:conv_forward -s 1 -c 1 python scripts/launch_layer.py --kernel "$kernel" --layer "$layer" "$@" > "$log" 2>&1
  el "$name rc=$? $(grep -E "gpu__time_duration.sum|gmma_cycles_active|lts__throughput.avg|dram__throughput.avg|issue_active" "$log" | awk '{print $1, $NF}' | tr '\n' ' ')"
  tar -C "$OUT" -czf "$OUT/all.tar.gz" logs; }
T() { echo "{\"bm\": $1, \"bn\": $2, \"bk\": $3, \"warps_m\": $(( $1 / 16 )), \"warps_n\": 1, \"stages\": $4, \"split_k\": 1, \"gather\": \"$5\", \"schedule\": \"$6\"${7:+, \"rows\": $7}}"; }
prof conv2-128x128 wgmma-3xtf32 128,96,27,27,256,5,1,2,2 --bias --config "$(T 128 128 32 3 table persistent)"
prof conv2-128x96 wgmma-3xtf32 128,96,27,27,256,5,1,2,2 --bias --config "$(T 128 96 32 4 table persistent)"
prof resnet16-halo2 wgmma-fp16 64,64,56,56,64,3,1,1 --epilogue none --config "$(T 64 120 64 4 tap halo 2)"
prof vgg16-ws wgmma-fp16 16,128,112,112,128,3,1,1 --epilogue none --config "$(T 128 256 64 4 tap persistent)"
prof vgg16-halo2 wgmma-fp16 16,128,112,112,128,3,1,1 --epilogue none --config "$(T 128 232 64 4 tap halo 2)"
el done
