"""One launch of a kernel on random inputs, checked against float64: the job compute-sanitizer
watches (`convlab check --sanitize`) and the fault and hang tests run, in an isolated child
process (convlab.gpu.isolate). It takes and returns JSON-able values."""

from __future__ import annotations

import numpy as np

from ..gpu.isolate import gpu_wait
from ..kernels import get_variant
from ..oracle.verify import compare, random_problem, reference_output
from ..shapes import ConvShape
from .kernelfile import load_kernel_file


def job_variant(kernel_file: str | None, variant: str | None):
    """(the Variant, its kernel-file record summary or None)."""
    if kernel_file is not None:
        loaded = load_kernel_file(kernel_file)
        return loaded.variant, {"path": kernel_file, "sha256": loaded.sha256}
    return get_variant(variant), None


def exercise(shape: dict, kernel_file: str | None = None, variant: str | None = None,
             epilogue: str | None = None, seed: int | None = None,
             config: dict | None = None) -> dict:
    """Prepare the kernel for `shape` (with `config`, a tunable variant's dict form, that
    config), launch it once on random inputs into a poisoned output, wait for it, and check the
    result against float64."""
    import cupy

    # Every array its own cudaMalloc (no pool), so compute-sanitizer sees each one's bounds.
    cupy.cuda.set_allocator(None)
    chosen, record = job_variant(kernel_file, variant)
    if config is not None:
        chosen = chosen.configured(config)
    layer = ConvShape(**shape)
    x, w, b = random_problem(layer, np.random.default_rng(seed), signed=True)
    op = chosen.prepare(layer, w, epilogue, b)
    # run_once's temporaries are freed as it returns, and without a pool each cudaFree waits for
    # the kernel: a launch that never ends hangs there, so the parent must be timing it already.
    with gpu_wait():
        got = op.run_once(x, cupy)
        cupy.cuda.Device().synchronize()
    check = compare(cupy.asnumpy(got), reference_output(x, w, layer, epilogue, b),
                    chosen.precision)
    return {"variant": chosen.name, "kernel_file": record, "check": check.as_dict()}
