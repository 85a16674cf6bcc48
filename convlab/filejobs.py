"""Jobs that run a kernel in an isolated child process (convlab.isolate): each takes and returns
JSON-able values. `exercise` is one launch on random inputs, checked: what compute-sanitizer
watches and what the fault and hang tests run. `time_layer` is `convlab.lab.run_layer` for a
kernel file: the row a compare of one random layer needs."""

from __future__ import annotations

import numpy as np

from .kernels import get_variant
from .shapes import ConvShape


def _variant(kernel_file: str | None, variant: str | None):
    """(the Variant, its kernel-file record summary or None)."""
    if kernel_file is not None:
        from .userkernel import load_kernel_file

        loaded = load_kernel_file(kernel_file)
        return loaded.variant, {"path": kernel_file, "sha256": loaded.sha256}
    return get_variant(variant), None


def exercise(shape: dict, kernel_file: str | None = None, variant: str | None = None,
             epilogue: str | None = None, seed: int | None = None) -> dict:
    """Prepare the kernel for `shape`, launch it once on random inputs into a poisoned output,
    wait for it, and check the result against float64."""
    import cupy

    from .isolate import gpu_wait
    from .verify import compare, poison, random_problem, reference_output

    # Every array its own cudaMalloc (no pool), so compute-sanitizer sees each one's bounds.
    cupy.cuda.set_allocator(None)
    chosen, record = _variant(kernel_file, variant)
    layer = ConvShape(**shape)
    x, w, b = random_problem(layer, np.random.default_rng(seed), signed=True)
    op = chosen.prepare(layer, w, epilogue, b)
    xd = cupy.asarray(x)
    y = cupy.empty(op.output_shape, dtype=cupy.float32)
    poison(y)
    op(op.stage(xd), y)
    with gpu_wait():
        cupy.cuda.Device().synchronize()
    check = compare(cupy.asnumpy(op.output(y)), reference_output(x, w, layer, epilogue, b),
                    chosen.precision)
    return {"variant": chosen.name, "kernel_file": record, "check": check.as_dict()}


def time_layer(shape: dict, kernel_file: str | None = None, variant: str | None = None,
               policy: dict | None = None, epilogue: str | None = None,
               seed: int | None = None) -> dict:
    """lab.run_layer in the child: the LayerResult as a dict, with the kernel file's hash."""
    from . import lab, measure

    chosen, record = _variant(kernel_file, variant)
    result = lab.run_layer(ConvShape(**shape), chosen, measure.TimingPolicy(**(policy or {})),
                           epilogue, seed)
    return {"layer": result.as_dict(), "kernel_file": record}
