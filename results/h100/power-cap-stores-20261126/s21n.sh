#!/usr/bin/env bash
# Session 21, call 16 (one H100): call 15's three timer-guard failures alone, then the stream file.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=120 CONVLAB_CACHE_DIR=$PWD/gpu-out/cache-full
L=$OUT/logs; mkdir -p "$L"
python -m pip install --no-deps --no-build-isolation -q -e . > "$L/install.log" 2>&1 || { cat "$L/install.log"; exit 1; }
nvidia-smi -L | tee "$L/gpus.log"
timeout 60 python -m pytest -m gpu -q -p no:cacheprovider -rfE "tests/test_gpu_winograd.py::test_tuned_configuration_becomes_the_default_choice" "tests/test_gpu.py::test_network_reproduces_cpu_accuracy[wgmma-bf16-ece408-low]" "tests/test_gpu.py::test_alexnet_top1_matches_float64[wgmma]" > "$L/rerun.log" 2>&1; echo "rerun rc=$? $(tail -n 1 $L/rerun.log)"
timeout 130 python -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_stream_gpu.py > "$L/stream.log" 2>&1; echo "stream rc=$? $(tail -n 1 $L/stream.log)"
