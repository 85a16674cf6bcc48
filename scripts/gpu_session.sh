#!/usr/bin/env bash
# One session on a GPU machine: install convlab (and, from ./.whl when present, the optional
# wheels the machine lacks: cupti-python, nvtx, Pillow), then run the chosen steps. Everything
# is written under $OUT (default ./gpu-out) and packed into $OUT/session.tar.gz; a short summary
# is printed last.
# Usage: scripts/gpu_session.sh STEP...   steps:
#   smoke        pytest -m "gpu and smoke": every variant's verdict in a few minutes
#   tests        pytest -m gpu (PYTEST_ADDOPTS narrows it, e.g. -k alexnet)
#   dispatch     scripts/dispatch_study.py: what timing one launch on an idle GPU added
#   alexnet      run alexnet at batch 128 (with PyTorch eager) and a batch sweep 1..1024
#   compare      compare every variant on the AlexNet layers, the ResNet-style layer and the
#                course models; records under records/
#   sweep        scripts/sweep_pipelined.py and scripts/sweep.py (tilings)
#   profile      the course-style profiles and the batch sweep (needs cupti-python)
#   runs         convlab run for every variant and course model at batch 10000
#   study        scripts/pipeline_study.py: what pinned buffers, graphs and overlap buy
#   sanitize     compute-sanitizer memcheck over every shipped variant
#   ncu          Nsight Compute on chosen layers (NCU_JOBS: kernel@layer ...) through
#                scripts/launch_layer.py, and (NCU_PRODUCT=1) the command `profile --ncu` prints
#   baseline     the course models against the committed compare records (--baseline;
#                BASELINE_KERNELS, with cuDNN's rows added)
#   workflow     the kernel-file workflow of the README, each command timed
#   streams      run --images: alexnet at batch 128 and 1024 in fp16, tf32 and the fp32 class
#                and ece408 at 10,000 (STREAM_PYTORCH=1 adds PyTorch's stream), records and
#                timelines under records/
#   tune         convlab tune on TUNE_LAYER (default AlexNet conv3) for TUNE_KERNEL, then
#                compare AlexNet's layers with that variant: the tuned tiling is used
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
      # take the session; FILE@EXPR runs the tests of FILE that pytest's -k EXPR selects, '+'
      # standing for a space (a long file split in shards). The timer defences compare wall
      # and event times, which other processes on the same GPU disturb: the files in
      # TEST_SEQUENTIAL run one after another once the parallel ones are done.
      run_test() {  # run_test SPEC INDEX
        local file=${1%%@*} expr="" name
        [[ $1 == *@* ]] && expr=${1#*@}
        name=$(basename "$file" .py)${expr:+-$2}
        timeout "${TEST_LIMIT:-480}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
          --durations=5 ${expr:+-k "$expr"} "$file" > "$work/logs/$name.log" 2>&1
      }
      index=0
      for spec in ${TEST_FILES-tests/test_gpu.py@not+network_reproduces+and+not+alexnet+and+not+compare \
          tests/test_gpu_general.py \
          tests/test_gpu_pipelined.py tests/test_gpu_winograd.py tests/test_gpu_tuning.py \
          tests/test_ops_gpu.py \
          tests/test_imagenet.py tests/test_profile_gpu.py}; do
        index=$((index + 1))
        run_test "${spec//+/ }" "$index" &
        sleep 2
        while [[ $(jobs -r | wc -l) -ge ${TEST_JOBS:-4} ]]; do sleep 1; done
      done
      wait
      # Whole-network runs go through the lab's timer defences too (lab.run).
      for spec in ${TEST_SEQUENTIAL-tests/test_gpu.py@compare \
          tests/test_gpu.py@network_reproduces+or+alexnet tests/test_userkernel_gpu.py \
          tests/test_kernelfile_runs_gpu.py}; do
        index=$((index + 1))
        run_test "${spec//+/ }" "$index"
      done
      for log in "$work"/logs/test_*.log; do
        summary+=("$(basename "$log" .log): $(tail -n 1 "$log")")
        grep -E "^(FAILED|ERROR)" "$log" | cut -c1-300 | head -n 12
      done ;;
    smoke)
      timeout "${TEST_LIMIT:-480}" python3 -m pytest -m "gpu and smoke" -q -p no:cacheprovider -rfEs \
        --durations=5 tests > "$work/logs/smoke.log" 2>&1
      summary+=("smoke: $(tail -n 1 "$work/logs/smoke.log")")
      grep -E "^(FAILED|ERROR)" "$work/logs/smoke.log" | cut -c1-300 | head -n 20 ;;
    dispatch)
      python3 scripts/dispatch_study.py --out "$work/records/dispatch-study.json" 2>&1 \
        | tee "$work/logs/dispatch-study.log" ;;
    alexnet)
      # One run per precision class at batch 128 against PyTorch's best in that class; the
      # batch sweep (ALEXNET_SWEEP=1) without PyTorch, whose compiled candidates take minutes.
      for kernel in ${ALEXNET_KERNELS:-pipelined-3xtf32 pipelined pipelined-fp16}; do
        convlab run --model alexnet --kernel "$kernel" --batch 128 --pytorch --wide 2>&1 \
          | tee "$work/logs/run-alexnet-128-$kernel.log" | tail -n 32
      done
      if [[ ${ALEXNET_SWEEP:-0} == 1 ]]; then
        convlab run --model alexnet --batch "$ALEXNET_BATCHES" --wide 2>&1 \
          | tee "$work/logs/run-alexnet-sweep.log" | tail -n 20
      fi ;;
    compare)
      convlab device | tee "$work/logs/device.txt"
      kernels=${KERNELS:-all}
      for model in ${COMPARE_MODELS:-alexnet ece408-high ece408}; do
        batch=${BATCHES:-}; [[ -z $batch && $model == alexnet ]] && batch=128
        convlab compare --kernels "$kernels" --model "$model" ${batch:+--batch "$batch"} \
          --budget "${BUDGET:-1}" --save "$work/records" --wide > "$work/logs/compare-$model.log" 2>&1
      done
      for layer in ${COMPARE_LAYERS-64,64,56,56,64,3,1,1}; do
        convlab compare --kernels "$kernels" --layer "$layer" --batch "${layer%%,*}" \
          --budget "${BUDGET:-1}" --save "$work/records" --wide > "$work/logs/compare-$layer.log" 2>&1
      done
      python3 scripts/summarize.py "$work/records" | tee "$work/logs/summary.txt" | cut -c1-400 ;;
    sweep)
      python3 scripts/sweep_pipelined.py --out "$work/records/sweep-pipelined.json" ${SWEEP_ARGS:-} 2>&1 \
        | tee "$work/logs/sweep-pipelined.log" | tail -n 40 ;;
    profile)
      for kernel in "${PROFILE_KERNEL:-fused}" cudnn; do
        for batch in 10 100 10000; do
          convlab profile --model ece408 --kernel "$kernel" --batch "$batch" --save "$work/records" \
            --wide > "$work/logs/profile-ece408-$kernel-$batch.log" 2>&1
        done
      done
      convlab profile --model ece408 --kernel "${PROFILE_KERNEL:-fused}" \
        --batch 1,10,100,1000,10000 --save "$work/records" --wide \
        --plot "$work/records/profile-ece408-sweep.png" > "$work/logs/profile-ece408-sweep.log" 2>&1
      convlab profile --model alexnet --batch "$ALEXNET_BATCHES" --save "$work/records" --wide \
        --plot "$work/records/profile-alexnet-sweep.png" > "$work/logs/profile-alexnet-sweep.log" 2>&1
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
      PYTHON=python3 bash scripts/sanitize_all.sh > "$work/logs/sanitize.log" 2>&1
      tail -n 20 "$work/logs/sanitize.log" ;;
    ncu)
      # NCU_ARGS (default --set full) picks what ncu collects, e.g. --metrics regex:...
      for job in ${NCU_JOBS:-pipelined@128,256,13,13,384,3,1,1}; do
        kernel=${job%%@*}; layer=${job#*@}
        log="$work/logs/ncu-$kernel-${layer//,/x}.log"
        timeout 240 ncu ${NCU_ARGS:---set full} -k regex:conv_forward -s 1 -c 1 \
          python3 scripts/launch_layer.py --kernel "$kernel" --layer "$layer" --bias > "$log" 2>&1
        grep -E "tiling|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy" \
          "$log" | head -n 8
      done
      if [[ ${NCU_PRODUCT:-1} == 1 ]]; then  # the command `convlab profile --ncu` prints, run
        command=$(convlab profile --model ece408 --kernel register-tiled --batch 100 --ncu \
          --ncu-layer conv2 | tee "$work/logs/profile-ncu.log" | grep -m1 '^  ncu ')
        (cd "$work/records" && timeout 240 bash -c "$command" > ../logs/profile-ncu-run.log 2>&1 \
          && ncu --import ./*.ncu-rep --section LaunchStats >> ../logs/profile-ncu-run.log 2>&1)
        grep -E "conv_forward|Grid Size|Block Size" "$work/logs/profile-ncu-run.log" | head -n 6
      fi ;;
    baseline)
      for model in ece408 ece408-high; do
        record=$(ls results/h100/compare-$model-2*.json | tail -n 1)
        convlab compare --kernels "${BASELINE_KERNELS:-tiled,register-tiled,fused,tensorcore}" \
          --model "$model" --batch 10000 --baseline "$record" --save "$work/records" --wide \
          > "$work/logs/baseline-$model.log" 2>&1
        tail -n 25 "$work/logs/baseline-$model.log"
      done ;;
    tune)
      layer=${TUNE_LAYER:-128,256,13,13,384,3,1,1}; kernel=${TUNE_KERNEL:-pipelined}
      convlab tune --layer "$layer" --kernel "$kernel" --bias --epilogue relu --budget 0.3 \
        --plot "$work/records/tune-$kernel-${layer//,/x}.png" --wide 2>&1 \
        | tee "$work/logs/tune-$kernel.log" | tail -n 25
      python3 scripts/launch_layer.py --kernel "$kernel" --layer "$layer" --bias --launches 0
      convlab compare --model alexnet --batch 128 --kernels "$kernel" --wide \
        > "$work/logs/tune-compare-$kernel.log" 2>&1
      grep -E "^ *128 +$kernel " "$work/logs/tune-compare-$kernel.log" ;;
    streams)
      pytorch=(); [[ ${STREAM_PYTORCH:-0} == 1 ]] && pytorch=(--pytorch)
      for job in alexnet:wgmma-fp16:128,1024:20480 alexnet:wgmma:128,1024:10240 \
                 alexnet:wgmma-3xtf32:128,1024:10240 ece408:fused:10000:50000; do
        IFS=: read -r model kernel batches images <<< "$job"
        convlab run --model "$model" --kernel "$kernel" --batch "$batches" --images "$images" \
          "${pytorch[@]}" --save "$work/records" --plot "$work/records/stream-$model-$kernel.png" \
          > "$work/logs/stream-$model-$kernel.log" 2>&1
        summary+=("stream $model $kernel: $(grep -E '^batch [0-9]+: ' \
          "$work/logs/stream-$model-$kernel.log" | tr '\n' ' ')")
      done ;;
    workflow)
      bash scripts/kernel_file_workflow.sh "$work/workflow" 2>&1 | tee "$work/logs/workflow.log" \
        | tail -n 15 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  pack
done
pack && rm -rf "$work"
printf '%s\n' "${summary[@]}"
