#!/usr/bin/env bash
# Session 19, call 3 (one H100): the persistent schedule taking its work units from a counter
# (and splitting a short last round): GPU smoke, the same tilings under HEAD (gpu-out/base)
# and this tree, then ncu's SM-active cycles.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-400 | head; pack; }
t smoke 200 -n 12 tests/test_gpu_pipelined.py -k "wgmma and (persistent or split or fp16_output or alexnet or general)"
grep -E "tail tiles" "$L/smoke.log" | head
ab() { local tag=$1 tree=$2; shift 2
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-$tag PYTHONPATH=$tree timeout "$(left 70)" python gpu-out/ab.py $tag "$@" >> "$L/ab-$tag.log" 2>&1
  grep "^AB" "$L/ab-$tag.log" > "$L/ab-$tag.txt"; }
for c in conv2f32 vgg16 conv4f16 1x1f16 conv3f32 1x1f32 conv1f32; do
  [[ $(left 60) -lt 40 ]] && break
  ab old $PWD/gpu-out/base $c; ab new $PWD $c
  el "$c"; grep -h "^AB .* $c " "$L/ab-old.txt" "$L/ab-new.txt"; pack
done
M="lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg,gpu__time_duration.sum,sm__cycles_elapsed.avg"
prof() { local name=$1 kernel=$2 layer=$3; shift 3
  [[ $(left 30) -lt 20 ]] && return
  timeout "$(left 40)" ncu --clock-control none --metrics "$M" -k regex:conv_forward -s 1 -c 1 env PYTHONPATH=$PWD python scripts/launch_layer.py --kernel "$kernel" --layer "$layer" "$@" > "$L/ncu-$name.txt" 2>&1
  el "$name $(grep -E "sm__cycles_active.avg|sm__cycles_elapsed.avg|gpu__time_duration" "$L/ncu-$name.txt" | awk '{print $1, $NF}' | tr '\n' ' ')"; pack; }
T() { echo "{\"bm\": $1, \"bn\": $2, \"bk\": $3, \"warps_m\": $(( $1 / 16 )), \"warps_n\": 1, \"stages\": $4, \"split_k\": 1, \"gather\": \"$5\", \"schedule\": \"$6\"${7:+, \"rows\": $7}}"; }
prof conv2-128x128 wgmma-3xtf32 128,96,27,27,256,5,1,2,2 --bias --config "$(T 128 128 32 3 table persistent)"
prof vgg16-ws wgmma-fp16 16,128,112,112,128,3,1,1 --epilogue none --config "$(T 128 256 64 4 tap persistent)"
el done
