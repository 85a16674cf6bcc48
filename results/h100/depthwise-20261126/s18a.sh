#!/usr/bin/env bash
# Session 18, call 1 (one H100): the depthwise variants' smoke and first numbers (untuned, then
# tuned) on four depthwise layers; the survey's lost shapes (1x1, VGG 3x3, 3x3 s2) tuned for
# wgmma / wgmma-fp16 and compared.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { cp gpu-out/cache/tune-cache.json "$R/tune-cache.json" 2>/dev/null; tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; cat "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-400 | head; pack; }
tune() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv tune "$@" --budget 0.1 --jobs 14 --wide > "$L/tune-$name.log" 2>&1
  el "tune $name rc=$? $(grep -iE "fastest|best|stored" "$L/tune-$name.log" | head -2 | cut -c1-160)"; pack; }
cmp() { local name=$1 lim=$2 spec=$3 kernels=$4
  [[ $(left 60) -lt 25 ]] && return
  timeout "$(left "$lim")" /tmp/cv compare --layer "$spec" --kernels "$kernels" --budget 0.3 --batch "${spec%%,*}" --save "$R" > "$L/cmp-$name.log" 2>&1
  el "cmp $name rc=$?"; grep -E "^\| *[0-9]" "$L/cmp-$name.log" | awk -F'|' '{print $3,$4,$5,$6,$13,$15}' | head -12; pack; }
DWK=depthwise,depthwise-fp16,depthwise-bf16
DW=64,128,56,56,128,3,1,1,128
t smoke-dw 150 tests/test_gpu_depthwise.py
t smoke-dw-general 150 -k depthwise tests/test_gpu_general.py tests/test_gpu.py
cmp dw-untuned 60 $DW $DWK
for k in depthwise depthwise-fp16; do tune $k-dw 70 --kernel $k --layer $DW; done
cmp dw-tuned 60 $DW $DWK
cmp dw-s2 50 64,128,112,112,128,3,2,1,128 depthwise,depthwise-fp16
cmp dw-7x7 50 64,96,56,56,96,7,1,3,96 depthwise,depthwise-fp16
cmp dw-5x5 50 64,240,28,28,240,5,1,2,240 depthwise,depthwise-fp16
ONE=64,256,56,56,64,1; VGG=16,128,112,112,128,3,1,1; S2=64,64,56,56,128,3,2,1
tune wgmma-fp16-1x1 70 --kernel wgmma-fp16 --layer $ONE
tune wgmma-fp16-vgg 70 --kernel wgmma-fp16 --layer $VGG
cmp one 50 $ONE wgmma,wgmma-fp16
cmp vgg 50 $VGG wgmma,wgmma-fp16
tune wgmma-1x1 60 --kernel wgmma --layer $ONE
tune wgmma-vgg 60 --kernel wgmma --layer $VGG
tune wgmma-fp16-s2 60 --kernel wgmma-fp16 --layer $S2
cmp one2 50 $ONE wgmma,wgmma-fp16
cmp vgg2 50 $VGG wgmma,wgmma-fp16
cmp s2 50 $S2 wgmma-fp16
pack
el done
