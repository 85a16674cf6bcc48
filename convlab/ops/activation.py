"""Elementwise activations (ReLU, tanh), for the layers no neighbouring kernel absorbs."""

from .base import ACTIVATION_SOURCE

SOURCE = r"""
// activation: y[i] = act(x[i]), one thread per element, 64-bit index. Where the network can,
// it fuses activations into the kernel before (conv, FC) or after (max-pool) them; this is the
// stand-alone pass for the rest: one read and one write per element, which is all it costs.
// x and y may be the same array (in place): each thread reads its element before writing it
// and touches no other, so the pointers are deliberately not __restrict__.
// Compile-time: ACT, BLOCK.
""" + ACTIVATION_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(BLOCK)
activation(const float* x, float* y, long long total)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < total) y[i] = activate(x[i]);
}
"""

import numpy as np  # noqa: E402

from ..oracle.verify import Reference  # noqa: E402
from ..shapes import NCHW  # noqa: E402
from .base import (ACTIVATION_LABELS, KernelSpec, LayerOp, activation_absolute,  # noqa: E402
                   apply_activation, ceil_div, check_activation, check_layout, compile_specs,
                   spec)

BLOCK = 256


def activation_kernel(shape, kind: str) -> KernelSpec:
    if kind is None:
        raise ValueError("an activation op needs a kind: relu or tanh")
    total = int(np.prod(shape))
    if total < 1:
        raise ValueError(f"an activation needs a non-empty shape, got {tuple(shape)}")
    return spec("ops.activation", "activation", SOURCE,
                {"ACT": check_activation(kind), "BLOCK": BLOCK}, (ceil_div(total, BLOCK),), BLOCK)


def prepare_activation(shape, kind: str, layout: str = NCHW) -> LayerOp:
    """y = kind(x) elementwise over any shape; x and y may be the same array. Elementwise
    work does not care for the memory format: `layout` only says what the output holds."""
    kernel_spec = activation_kernel(shape, kind)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    total = np.int64(np.prod(shape))

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y, total))

    return LayerOp(ACTIVATION_LABELS[kind], "activation", "activation", launch, tuple(shape),
                   compiled.seconds, layout=check_layout(layout))


def reference_activation(x: np.ndarray, kind: str) -> Reference:
    """The float64 result: ReLU of a float32 is exact (zero bound); tanhf is within
    TANH_ABSOLUTE."""
    values = apply_activation(np.asarray(x, dtype=np.float64), kind)
    return Reference(values, np.zeros_like(values), 1, activation_absolute(kind))
