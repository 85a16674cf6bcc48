#!/usr/bin/env bash
# compute-sanitizer memcheck over every shipped variant on small shapes (one checked launch
# each, in an isolated child process), plus the kernel-file sanitizer tests. Needs a GPU and
# compute-sanitizer (CUDA toolkit, or: pip install nvidia-cuda-sanitizer-api-cu12).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
exec "$python" -m pytest -m gpu -q -rs tests/test_userkernel_gpu.py -k "memcheck" "$@"
