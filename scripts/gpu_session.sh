#!/usr/bin/env bash
# One session on a GPU machine: install convlab (and, from ./.whl when present, the optional
# wheels the machine lacks: cupti-python, nvtx, Pillow), then run the chosen steps. Everything
# is written under $OUT (default ./gpu-out) and packed into $OUT/session.tar.gz; a short summary
# is printed last.
# Usage: scripts/gpu_session.sh STEP...   steps:
#   tests        pytest -m gpu (PYTEST_ADDOPTS narrows it, e.g. -k alexnet)
#   alexnet      run alexnet at batch 128 (with PyTorch eager) and a batch sweep 1..1024
#   compare      compare every variant on the AlexNet layers, the ResNet-style layer and the
#                course models; records under records/
#   sweep        scripts/sweep_pipelined.py and scripts/sweep.py (tilings)
#   profile      the course-style profiles and the batch sweep (needs cupti-python)
#   runs         convlab run for every variant and course model at batch 10000
#   study        scripts/pipeline_study.py: what pinned buffers, graphs and overlap buy
#   sanitize     compute-sanitizer memcheck over every shipped variant
set -uo pipefail
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(tests compare)
OUT=${OUT:-gpu-out}
work="$OUT/session"
mkdir -p "$work/logs" "$work/records"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160}
# Carried wheels, each only where the machine lacks that distribution (a second copy of
# cuda-bindings or Pillow beside the installed one could break PyTorch or CuPy).
missing=()
for wheel in .whl/*.whl; do
  [[ -e $wheel ]] || continue
  dist=$(basename "$wheel" | cut -d- -f1)
  python3 -m pip show -q "$dist" > /dev/null 2>&1 || missing+=("$wheel")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site "${missing[@]}" > "$work/logs/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
python3 -m pip list 2>/dev/null | grep -i -E "cupy|torch|cuda|nvtx|pillow|matplotlib|cupti|numpy" \
  > "$work/logs/pip-list.txt"; printf '%s\n' "${missing[@]}" >> "$work/logs/pip-list.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$work/logs/install.log" 2>&1 \
  || { cat "$work/logs/install.log"; exit 1; }
nvidia-smi > "$work/logs/nvidia-smi.txt" 2>&1
summary=()
# Packed after every step, so a command stopped at its time limit still returns what the
# finished steps wrote (the device returns a few files only: one archive holds them all).
pack() { tar -C "$OUT" -czf "$OUT/session.tar.gz.part" session && mv "$OUT/session.tar.gz.part" "$OUT/session.tar.gz"; }
ALEXNET_BATCHES=${ALEXNET_BATCHES:-1,2,4,8,16,32,64,128,256,512,1024}
for step in "${steps[@]}"; do
  case $step in
    tests)
      # GPU test files in parallel processes, each with a time limit so one slow file cannot
      # take the session. The timer defences compare wall and event times, which other
      # processes on the same GPU disturb: TEST_JOBS=1 runs the files one after another.
      for file in ${TEST_FILES:-tests/test_*gpu*.py tests/test_imagenet.py}; do
        name=$(basename "$file" .py)
        timeout "${TEST_LIMIT:-480}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
          --durations=5 "$file" > "$work/logs/$name.log" 2>&1 &
        sleep 2
        [[ ${TEST_JOBS:-4} -le 1 ]] && wait
        while [[ $(jobs -r | wc -l) -ge ${TEST_JOBS:-4} ]]; do sleep 1; done
      done
      wait
      for log in "$work"/logs/test_*.log; do
        summary+=("$(basename "$log" .log): $(tail -n 1 "$log")")
        grep -E "^(FAILED|ERROR)" "$log" | cut -c1-300 | head -n 12
      done ;;
    alexnet)
      convlab run --model alexnet --batch 128 --pytorch --wide 2>&1 | tee "$work/logs/run-alexnet-128.log" | tail -n 45
      convlab run --model alexnet --batch "$ALEXNET_BATCHES" --pytorch --wide 2>&1 \
        | tee "$work/logs/run-alexnet-sweep.log" | tail -n 20 ;;
    compare)
      convlab device | tee "$work/logs/device.txt"
      kernels=${KERNELS:-all}
      for model in ${COMPARE_MODELS:-alexnet ece408-high ece408}; do
        batch=${BATCHES:-}; [[ -z $batch && $model == alexnet ]] && batch=128
        convlab compare --kernels "$kernels" --model "$model" ${batch:+--batch "$batch"} \
          --budget "${BUDGET:-1}" --save "$work/records" --wide > "$work/logs/compare-$model.log" 2>&1
      done
      for layer in ${COMPARE_LAYERS:-64,64,56,56,64,3,1,1}; do
        convlab compare --kernels "$kernels" --layer "$layer" --batch "${layer%%,*}" \
          --budget "${BUDGET:-1}" --save "$work/records" --wide > "$work/logs/compare-$layer.log" 2>&1
      done
      python3 scripts/summarize.py "$work/records" | tee "$work/logs/summary.txt" | cut -c1-400 ;;
    sweep)
      python3 scripts/sweep_pipelined.py --out "$work/records/sweep-pipelined.json" 2>&1 \
        | tee "$work/logs/sweep-pipelined.log" | tail -n 40 ;;
    profile)
      for kernel in "${PROFILE_KERNEL:-register-tiled}" cudnn; do
        for batch in 10 100 10000; do
          convlab profile --model ece408 --kernel "$kernel" --batch "$batch" --save "$work/records" \
            > "$work/logs/profile-ece408-$kernel-$batch.log" 2>&1
        done
      done
      convlab profile --model ece408 --kernel "${PROFILE_KERNEL:-register-tiled}" \
        --batch 1,10,100,1000,10000 --save "$work/records" > "$work/logs/profile-ece408-sweep.log" 2>&1
      convlab profile --model alexnet --batch "$ALEXNET_BATCHES" --save "$work/records" \
        > "$work/logs/profile-alexnet-sweep.log" 2>&1
      tail -n 30 "$work/logs/profile-alexnet-sweep.log" ;;
    runs)
      for model in ece408-high ece408-low ece408; do
        for kernel in ${RUN_KERNELS:-naive tiled register-tiled fused}; do
          convlab run --kernel "$kernel" --model "$model" --batch 10000 2>&1 \
            | tee "$work/logs/run-$model-$kernel.log" | grep -E "^(Op Time|Correctness)"
        done
      done ;;
    study)
      python3 scripts/pipeline_study.py --batch "${STUDY_BATCHES:-1,128,1024}" \
        --out "$work/records/pipeline-study.json" 2>&1 | tee "$work/logs/pipeline-study.log" ;;
    sanitize)
      bash scripts/sanitize_all.sh > "$work/logs/sanitize.log" 2>&1
      tail -n 20 "$work/logs/sanitize.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  pack
done
pack && rm -rf "$work"
printf '%s\n' "${summary[@]}"
