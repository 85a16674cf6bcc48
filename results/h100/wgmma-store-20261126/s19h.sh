#!/usr/bin/env bash
# Session 19, call 8 (one H100): Nsight Compute on cuDNN's own kernels (PyTorch, channels-last,
# benchmark mode) for the layers near or below 1.0x: the kernel it picks, its launch (grid,
# block, cluster, shared memory, registers), SM-active cycles, L2/DRAM throughput.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 PYTHONPATH=$PWD
L=$OUT/logs; rm -rf "$OUT/logs" "$OUT/records"; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-300}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
M="sm__cycles_active.avg,sm__cycles_elapsed.avg,gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__cluster_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_shared_mem,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
prof() { local name=$1; shift
  [[ $(left 30) -lt 20 ]] && return
  timeout "$(left 60)" ncu --clock-control none --profile-from-start off --metrics "$M" python gpu-out/cudnn_layer.py "$@" > "$L/ncu-cudnn-$name.txt" 2>&1
  el "$name rc=$?"; grep -E "^  [a-zA-Z_].*\(|gpu__time|cycles_active|cycles_elapsed|grid_size|block_size|cluster|registers|shared_mem_per|gmma|lts__|dram__" "$L/ncu-cudnn-$name.txt" | sed 's/  */ /g' | cut -c1-160
  tar -C "$OUT" -czf "$OUT/all.tar.gz" logs; }
prof vgg16 16,128,112,112,128,3,1,1,1 fp16
prof resnet16 64,64,56,56,64,3,1,1,1 fp16
prof conv3f16 128,256,13,13,384,3,1,1,1 fp16 bias
prof conv2f32 128,96,27,27,256,5,1,2,2 fp32 bias
el done
