#!/usr/bin/env bash
# Session 22, call 8 (one H100): the committed tree after the review (GATHER_TAP from the tiling's tap order): the shipped tunings found under its source
# hash (every tuned layer's tiling as config_for picks it), the GPU smoke tier, the fp16 forward.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s22h
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
python - <<'PY' 2>&1 | tee "$L/shipped.log"
import json
from convlab import tuning
from convlab.kernels import get_variant
from convlab.kernels.igemm.tiling import Tiling
from convlab.shapes import ConvShape
entries = json.loads(tuning.SHIPPED.read_text())["entries"].values()
found = 0
for e in entries:
    if not e["variant"].startswith("wgmma") or not e["device"].startswith("NVIDIA H100"):
        continue
    s = e["shape"]
    shape = ConvShape(s["B"], s["C"], s["H"], s["W"], s["M"], s["K"], stride=s["stride"], pad=s["pad"], groups=s["groups"], bias=s["bias"])
    v = get_variant(e["variant"])
    got = v.config_for(shape, e["epilogue"])
    ok = got == Tiling.from_dict(e["config"])
    found += ok
    print(f"{'OK ' if ok else 'MISS'} {e['variant']:13} {tuning.layer_text(shape):34} {got.brief()}")
print(f"shipped wgmma tilings picked: {found}")
PY
timeout 200 python -m pytest -m "gpu and smoke" -q -p no:cacheprovider -rfE -n 14 tests --ignore=tests/test_stream_gpu.py > "$L/smoke.log" 2>&1
el "smoke rc=$? $(tail -n 1 $L/smoke.log)"; grep -E "^(FAILED|ERROR)" "$L/smoke.log" | cut -c1-300 | head
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "tma or persistent_schedule" > "$L/tma-tests.log" 2>&1
el "tma tests rc=$? $(tail -n 1 $L/tma-tests.log)"; grep -E "^(FAILED|ERROR)" "$L/tma-tests.log" | cut -c1-300 | head
printf '#!/bin/sh\nexec python -c "from convlab.cli import main; main()" "$@"\n' > /tmp/cv; chmod +x /tmp/cv
timeout 60 /tmp/cv run --model alexnet --batch 128 --kernel wgmma-fp16 > "$L/run-fp16.log" 2>&1
el "run fp16 rc=$?"; grep -E "^(forward|top-1)" "$L/run-fp16.log" | cut -c1-110
