#!/usr/bin/env bash
# One session on a GPU machine: install convlab, run the GPU tests, the tiling sweep and the
# benchmarks. Everything is written under $OUT (default ./gpu-out) and packed into
# $OUT/session.tar.gz; a short summary is printed last.
# Usage: scripts/gpu_session.sh [tests] [sweep] [runs] [bench]   (default: tests bench)
# Environment: BATCHES, KERNELS (bench), SWEEP (variants to sweep), RUN_KERNELS (runs), and
# pytest's own PYTEST_ADDOPTS to narrow the tests (e.g. PYTEST_ADDOPTS="-k fused").
set -uo pipefail
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(tests bench)
OUT=${OUT:-gpu-out}
work="$OUT/session"
mkdir -p "$work/logs" "$work/records"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$work/logs/install.log" 2>&1 \
  || { cat "$work/logs/install.log"; exit 1; }
nvidia-smi > "$work/logs/nvidia-smi.txt" 2>&1
summary=()
for step in "${steps[@]}"; do
  case $step in
    tests)
      python3 -m pytest -m gpu -q -p no:cacheprovider -rfs tests 2>&1 \
        | tee "$work/logs/pytest-gpu.log" | tail -n 30
      summary+=("pytest -m gpu: $(tail -n 1 "$work/logs/pytest-gpu.log")") ;;
    sweep)
      python3 scripts/sweep.py --variants "${SWEEP:-register-tiled,fused}" --out "$work/records/sweep.json" \
        2>&1 | tee "$work/logs/sweep.log" ;;
    runs)
      for model in ece408-high ece408-low ece408; do
        for kernel in ${RUN_KERNELS:-naive tiled}; do
          COLUMNS=160 convlab run --kernel "$kernel" --model "$model" --batch 10000 2>&1 \
            | tee "$work/logs/run-$model-$kernel.log" | grep -E "^(Op Time|Correctness)"
        done
      done ;;
    bench)
      convlab device | tee "$work/logs/device.txt"
      for model in ece408-high ece408; do
        COLUMNS=250 convlab compare --kernels "${KERNELS:-all}" --model "$model" \
          --batch "${BATCHES:-10,100,1000,10000}" --save "$work/records" \
          --plot "$work/records/compare-$model.png" > "$work/logs/compare-$model.log" 2>&1
      done
      python3 scripts/summarize.py "$work/records" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
tar -C "$OUT" -czf "$OUT/session.tar.gz" session && rm -rf "$work"
printf '%s\n' "${summary[@]}"
