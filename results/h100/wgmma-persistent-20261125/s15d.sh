#!/usr/bin/env bash
# Session 15, call 4 (one H100): the ceilings test alone (it failed under six xdist workers),
# then Nsight Compute on the persistent kernels of the layers still short of cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-300}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
timeout "$(left 90)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -k "device_info_and_ceilings" tests/test_gpu.py > "$L/ceilings.log" 2>&1
el "ceilings: $(tail -n 1 "$L/ceilings.log")"
M="$(cat results/h100/session14-20261125/ncu/metrics.txt),lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
prof() { local kernel=$1 layer=$2; shift 2
  local log="$L/ncu-$kernel-${layer//,/x}.txt"
  timeout "$(left 70)" ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --metrics "$M" \
    -k regex:conv_forward -s 1 -c 1 python scripts/launch_layer.py --kernel "$kernel" --layer "$layer" "$@" > "$log" 2>&1
  el "$kernel $layer rc=$? $(grep -E "gpu__time_duration.sum|gmma_cycles_active|lts__throughput|dram__throughput" "$log" | awk '{print $1, $NF}' | tr '\n' ' ')"; }
prof wgmma-fp16 64,64,56,56,64,3,1,1 --epilogue none
prof wgmma-3xtf32 128,96,27,27,256,5,1,2,2 --bias
prof wgmma-fp16 128,256,13,13,384,3,1,1 --bias
tar -C "$OUT" -czf "$OUT/all.tar.gz" logs
