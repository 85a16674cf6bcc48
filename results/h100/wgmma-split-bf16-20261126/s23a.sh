#!/usr/bin/env bash
# Session 23, call 1 (one H100): what bounds 3xTF32 on wgmma with no copies (rs_bench: A from
# shared memory or registers), 3xTF32 partial sums over spans of K-tiles against one K-tile on
# the shipped tilings, and the 3xTF32 GPU tests on the span rule.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-s23a
L=$OUT/logs; mkdir -p "$L"
T0=$(date +%s); END=$((T0 + ${BUDGET:-540}))
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( END - $(date +%s) )); [[ $l -lt $1 ]] && echo $l || echo $1; }
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout "$(left 90)" python gpu-out/rs_bench.py > "$L/rs_bench.log" 2>&1; el "rs_bench rc=$?"
timeout "$(left 200)" python gpu-out/ab23.py 1,rule,8 > "$L/ab.log" 2>&1; el "ab rc=$?"
tail -n 3 "$L/ab.log" | grep -v "^AB" | cut -c1-300
timeout "$(left 220)" python -m pytest -m gpu -q -p no:cacheprovider -rfE -n 14 tests/test_gpu_pipelined.py -k "3xtf32" -s > "$L/tests.log" 2>&1
el "3xtf32 tests rc=$? $(tail -n 1 $L/tests.log)"
grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | head -10
grep -E "same-sign" "$L/tests.log" | cut -c1-150 | head -20
el done
grep -E "^BENCH" "$L/rs_bench.log"
grep -E "^AB " "$L/ab.log" | cut -c1-120
