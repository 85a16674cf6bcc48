#!/usr/bin/env bash
# Session 19, call 1 (one H100): the wgmma schedules' register epilogue (bias once a tile, an
# address per column) and the persistent schedule's split last round: GPU smoke, then the
# same tilings timed under HEAD's tree (gpu-out/base) and this one.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-570}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-400 | head; pack; }
t smoke 200 -n 12 tests/test_gpu_pipelined.py -k "wgmma and (persistent or halo or split or resident or fp16_output or general or alexnet)"
ab() { local tag=$1 tree=$2; shift 2
  CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-$tag PYTHONPATH=$tree timeout "$(left 70)" python gpu-out/ab.py $tag "$@" >> "$L/ab-$tag.log" 2>&1
  grep "^AB" "$L/ab-$tag.log" | tail -n +1 > "$L/ab-$tag.txt"; }
for c in resnet16 conv2f32 vgg16 conv4f16 1x1f16 resnet32; do
  [[ $(left 60) -lt 40 ]] && break
  ab old $PWD/gpu-out/base $c; ab new $PWD $c
  el "$c"; grep -h "^AB .* $c " "$L/ab-old.txt" "$L/ab-new.txt"; pack
done
el done
