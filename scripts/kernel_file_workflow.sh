#!/usr/bin/env bash
# The README's kernel-file workflow as a new user runs it, each command timed: scaffold a kernel,
# check it, run it, make the classic mistake (a flipped filter: a convolution instead of the
# cross-correlation) and read the diagnosis, then compare the fixed kernel with tiled and cuDNN.
# Needs a GPU for the runs (check works without one). Usage: scripts/kernel_file_workflow.sh DIR
set -uo pipefail
dir=${1:?usage: kernel_file_workflow.sh DIR}
mkdir -p "$dir" && cd "$dir" || exit 1
rm -f mine.cu flipped.cu
timings=()
now_us() { echo "${EPOCHREALTIME//[.,]/}"; }  # microseconds, whatever the locale's decimal point
since() { local d=$(( ($(now_us) - $1) / 100000 )); echo "$((d / 10)).$((d % 10))"; }
step() {  # step NAME COMMAND...: run it, show its output, note its wall time
  local name=$1; shift
  local start; start=$(now_us)
  echo "\$ $*"
  "$@"
  local rc=$?
  timings+=("$(printf '%-44s %6s s  exit %d' "$name" "$(since "$start")" "$rc")")
}
begin=$(now_us)
step "convlab new mine" convlab new mine
step "convlab check mine.cu" convlab check mine.cu
step "convlab run --kernel-file mine.cu" convlab run --kernel-file mine.cu
sed 's/k\[((m \* Cg + c) \* K + p) \* K + q\]/k[((m * Cg + c) * K + (K - 1 - p)) * K + (K - 1 - q)]/' \
  mine.cu > flipped.cu
grep -q "K - 1 - p" flipped.cu || { echo "the scripted edit did not apply"; exit 1; }
step "convlab run --kernel-file flipped.cu (a bug)" convlab run --kernel-file flipped.cu
step "convlab compare --kernel-file mine.cu ..." convlab compare --kernel-file mine.cu --kernels tiled,cudnn
echo
echo "commands' wall time (the reading and typing between them is not counted):"
printf '  %s\n' "${timings[@]}"
printf '  %-44s %6s s\n' "all five" "$(since "$begin")"
