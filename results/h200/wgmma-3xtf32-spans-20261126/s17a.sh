#!/usr/bin/env bash
# Session 17, call 1 (two H100s): GPU0 smoke + the 3xTF32 span/truncation experiment + a survey
# of common shapes; GPU1 the fp32 AlexNet forward beside PyTorch's candidates incl. max-autotune.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache PYTHONPATH=$PWD
L=$OUT/logs; R=$OUT/records; mkdir -p "$L" "$R"
T0=$(date +%s); END=$((T0 + ${BUDGET:-540}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
pack() { tar -C "$OUT" -czf "$OUT/all.tar.gz.part" logs records && mv "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"; }
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L > "$L/gpus.log"
t() { local name=$1 lim=$2; shift 2
  timeout "$(left "$lim")" python -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 "$@" > "$L/$name.log" 2>&1
  el "$name: $(tail -n 1 "$L/$name.log")"; grep -E "^(FAILED|ERROR)" "$L/$name.log" | cut -c1-300 | head; pack; }
(
  export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
  timeout "$(left 520)" /tmp/cv run --model alexnet --batch 128 --kernel wgmma-3xtf32 --pytorch --wide > "$L/run-fp32-pytorch.log" 2>&1
  el "run fp32 pytorch rc=$?"; tail -n 25 "$L/run-fp32-pytorch.log"
  du -sh /tmp/inductor; tar -C /tmp -czf "$OUT/inductor.tar.gz" inductor 2>/dev/null; ls -la "$OUT/inductor.tar.gz"
  pack
) > "$L/gpu1.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
t smoke 150 --timeout 120 -k "resident_filters_reload or same_sign or 3xtf32_passes or (halo and writes_fp16)" tests/test_gpu_pipelined.py
timeout "$(left 280)" python gpu-out/span_exp.py gpu-out/cache/tune-cache.json "1,0;1,1;2,1;4,1" > "$L/span.log" 2>&1
el "span rc=$?"; cat "$L/span.log"; pack
for spec in 64,256,56,56,64,1 64,64,56,56,128,3,2,1 64,128,56,56,128,3,1,1,128 64,3,224,224,64,7,2,3 16,128,112,112,128,3,1,1; do
  [[ $(left 60) -lt 30 ]] && break
  timeout "$(left 60)" /tmp/cv compare --layer $spec --kernels wgmma,wgmma-fp16,wgmma-3xtf32 --budget 0.3 --batch ${spec%%,*} --save "$R" > "$L/survey-$spec.log" 2>&1
  el "survey $spec rc=$?"; pack
done
wait
cat "$L/gpu1.log"
pack
