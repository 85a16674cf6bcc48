#!/usr/bin/env bash
# Session 14, call 4 (one H100): Nsight Compute on the wgmma variants where they lose to cuDNN
# (and two where they do not, for contrast); fp32 at batch 1024 again with the clocks logged.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-400}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
timeout "$(left 80)" /tmp/cv run --model alexnet --kernel wgmma-3xtf32 --batch 1024 > "$L/run-fp32-1024.log" 2>&1
el "run fp32 1024 rc=$?: $(grep -iE "forward|op time" "$L/run-fp32-1024.log" | head -3 | tr '\n' ' ')"
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER > "$L/clocks.log" 2>&1
ncu --query-metrics --chip gh100 > "$L/query.log" 2>&1
M=$(awk '{print $1}' "$L/query.log" | grep -E '^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active$' | sed 's/$/.ratio/' | paste -sd,)
for base in sm__pipe_tensor_op_gmma_cycles_active sm__pipe_tensor_op_hmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma; do
  grep -q "^$base " "$L/query.log" && M="$M,$base.avg.pct_of_peak_sustained_active"
done
M="$M,gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
echo "$M" > "$L/metrics.txt"; pack
for job in wgmma@128,256,13,13,384,3,1,1@bias wgmma-fp16@128,256,13,13,384,3,1,1@bias \
    wgmma@64,64,56,56,64,3,1,1@none wgmma-fp16@64,64,56,56,64,3,1,1@none \
    wgmma-3xtf32@128,96,27,27,256,5,1,2,2@bias wgmma-3xtf32@128,256,13,13,384,3,1,1@bias; do
  IFS=@ read -r kernel layer extra <<< "$job"
  args=(--kernel "$kernel" --layer "$layer"); [[ $extra == bias ]] && args+=(--bias) || args+=(--epilogue none)
  log="$L/ncu-$kernel-${layer//,/x}.txt"
  timeout "$(left 90)" ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --metrics "$M" \
    -k regex:conv_forward -s 1 -c 1 python scripts/launch_layer.py "${args[@]}" > "$log" 2>&1
  el "$kernel $layer rc=$? $(grep -E "gpu__time_duration.sum|gmma_cycles_active" "$log" | awk '{print $1, $NF}' | tr '\n' ' ')"; pack
done
