#!/usr/bin/env bash
# Session 14, call 1 (two H100s): GPU0 the stream tests and the streams against PyTorch;
# GPU1 the userkernel (hang fix), compare and kernel-file tests, then the float32-upload stream.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-560}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"; nproc >> "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-250 | head; pack; }
s() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" /tmp/cv run "$@" --save "$R" --plot "$R/$name.png" > "$L/$name.log" 2>&1
  el "$name rc=$? $(grep -E "^batch [0-9]+: [0-9,]+ images/s" "$L/$name.log" | tr '\n' ' ')"; pack; }
(
  export CUDA_VISIBLE_DEVICES=1
  t userkernel 300 --timeout 200 tests/test_userkernel_gpu.py
  t compare 150 -k compare tests/test_gpu.py
  t kernelfile 100 tests/test_kernelfile_runs_gpu.py
  s stream-alexnet-fp16-float32 80 --model alexnet --kernel wgmma-fp16 --batch 1024 --images 10240 --upload float32
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t stream-tests 200 tests/test_stream_gpu.py
s stream-alexnet-fp16 110 --model alexnet --kernel wgmma-fp16 --batch 128,1024 --images 20480 --pytorch
s stream-ece408 50 --model ece408 --kernel fused --batch 10000 --images 50000 --pytorch
s stream-alexnet-tf32 100 --model alexnet --kernel wgmma --batch 128,1024 --images 10240 --pytorch
s stream-alexnet-fp32 100 --model alexnet --kernel wgmma-3xtf32 --batch 128,1024 --images 10240 --pytorch
wait
cat "$L/gpu1.log"
for f in stream-alexnet-fp16 stream-ece408 stream-alexnet-tf32 stream-alexnet-fp32 stream-alexnet-fp16-float32; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9,]+ " "$L/$f.log" | head -6; done
pack
