"""Elementwise activations (ReLU, tanh), for the layers no neighbouring kernel absorbs."""

from ..gpu.elements import ELEMENT_SOURCE, FLOAT32, element_defines, values as element_values
from .base import ACTIVATION_SOURCE

SOURCE = r"""
// activation: y[i] = act(x[i]), one thread per element, 64-bit index. Where the network can,
// it fuses activations into the kernel before (conv, FC) or after (max-pool) them; this is the
// stand-alone pass for the rest: one read and one write per element, which is all it costs.
// x and y may be the same array (in place): each thread reads its element before writing it
// and touches no other, so the pointers are deliberately not __restrict__ (in place needs
// IN_HALF == OUT_HALF).
// Compile-time: ACT, BLOCK, IN_HALF, OUT_HALF.
""" + ACTIVATION_SOURCE + ELEMENT_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(BLOCK)
activation(const in_t* x, out_t* y, long long total)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < total) y[i] = to_out(activate(to_float(x[i])));
}
"""

import numpy as np  # noqa: E402

from ..oracle.verify import Reference  # noqa: E402
from ..shapes import NCHW  # noqa: E402
from .base import (ACTIVATION_LABELS, KernelSpec, LayerOp, activation_absolute,  # noqa: E402
                   apply_activation, ceil_div, check_activation, check_layout, compile_specs,
                   spec)

BLOCK = 256


def activation_kernel(shape, kind: str, in_dtype=FLOAT32, out_dtype=FLOAT32) -> KernelSpec:
    if kind is None:
        raise ValueError("an activation op needs a kind: relu or tanh")
    total = int(np.prod(shape))
    if total < 1:
        raise ValueError(f"an activation needs a non-empty shape, got {tuple(shape)}")
    return spec("ops.activation", "activation", SOURCE,
                {"ACT": check_activation(kind), "BLOCK": BLOCK,
                 **element_defines(in_dtype, out_dtype)}, (ceil_div(total, BLOCK),), BLOCK)


def prepare_activation(shape, kind: str, layout: str = NCHW, in_dtype=FLOAT32,
                       out_dtype=FLOAT32) -> LayerOp:
    """y = kind(x) elementwise over any shape, x of `in_dtype`, y of `out_dtype` (float32 or
    float16); x and y may be the same array. Elementwise work does not care for the memory
    format: `layout` only says what the output holds."""
    kernel_spec = activation_kernel(shape, kind, in_dtype, out_dtype)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    total = np.int64(np.prod(shape))

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y, total))

    return LayerOp(ACTIVATION_LABELS[kind], "activation", "activation", launch, tuple(shape),
                   compiled.seconds, layout=check_layout(layout),
                   output_dtype=np.dtype(out_dtype))


def reference_activation(x: np.ndarray, kind: str) -> Reference:
    """The float64 result: ReLU of a float32 is exact (zero bound); tanhf is within
    TANH_ABSOLUTE."""
    values = apply_activation(np.asarray(element_values(x), dtype=np.float64), kind)
    return Reference(values, np.zeros_like(values), 1, activation_absolute(kind))
