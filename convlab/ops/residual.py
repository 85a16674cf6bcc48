"""The residual add: a block's output plus its kept shortcut, with the activation after it."""

from ..gpu.elements import ELEMENT_SOURCE, FLOAT32, HALF_TYPES, element_defines, values
from .base import ACTIVATION_SOURCE

SOURCE = r"""
// add_kept: y[i] = act(x[i] + kept[i]), one thread per element, 64-bit index: the end of a
// residual block, where the body's last output meets the shortcut kept at the block's start.
// Both are in the same memory format, so the add is elementwise whatever the format. The kept
// activation may be 16-bit where it was written for a 16-bit conv (KEPT_HALF) while x is float32
// (or the other way), so it has its own element type. Elementwise: two reads and one write per
// element, the whole cost. The channels-last implicit GEMMs save a read and a write of that by
// adding the shortcut in their stores (the add-relu epilogue); this op adds it for the others.
// A thread reads x[i] before it writes y[i] and touches no other, so x and y are deliberately
// not __restrict__: a network writes the sum over x where nothing reads x after it.
// Compile-time: ACT, BLOCK, IN_HALF, OUT_HALF, KEPT_HALF, BF16_BITS.
""" + ACTIVATION_SOURCE + ELEMENT_SOURCE + r"""
#if KEPT_HALF
typedef unsigned short kept_t;
__device__ __forceinline__ float kept_float(kept_t e) { return half_bits_to_float(e); }
#else
typedef float kept_t;
__device__ __forceinline__ float kept_float(kept_t e) { return e; }
#endif

extern "C" __global__ void __launch_bounds__(BLOCK)
add_kept(const in_t* x, const kept_t* __restrict__ kept, out_t* y, long long total)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < total) y[i] = to_out(activate(to_float(x[i]) + kept_float(kept[i])));
}
"""

from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ..oracle.verify import Reference  # noqa: E402
from ..shapes import NCHW  # noqa: E402
from .base import (KernelSpec, LayerOp, activation_absolute, activation_label,  # noqa: E402
                   apply_activation, ceil_div, check_activation, check_layout, compile_specs,
                   spec)

BLOCK = 256


def add_kernel(shape, activation: str | None = None, in_dtype=FLOAT32, kept_dtype=FLOAT32,
               out_dtype=FLOAT32) -> KernelSpec:
    total = int(np.prod(shape))
    if total < 1:
        raise ValueError(f"a residual add needs a non-empty shape, got {tuple(shape)}")
    return spec("ops.residual", "add_kept", SOURCE,
                {"ACT": check_activation(activation), "BLOCK": BLOCK,
                 "KEPT_HALF": int(np.dtype(kept_dtype) in HALF_TYPES),
                 **element_defines(in_dtype, out_dtype, kept_dtype)},
                (ceil_div(total, BLOCK),), BLOCK)


@dataclass
class AddOp(LayerOp):
    """A LayerOp with a second operand: `kept`, the shortcut, set by the network before each
    launch (a buffer of the same pass; a CUDA graph captures it as it was)."""

    kept: object = None

    def __call__(self, x, y):
        self.launch(x, self.kept, y)


def prepare_add(shape, activation: str | None = None, layout: str = NCHW, in_dtype=FLOAT32,
                kept_dtype=FLOAT32, out_dtype=FLOAT32) -> AddOp:
    """y = activation(x + kept), elementwise over `shape`, all three in `layout`; each of its
    own element type (float32, float16 or bf16 bits); x and y may be the same array."""
    kernel_spec = add_kernel(shape, activation, in_dtype, kept_dtype, out_dtype)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    total = np.int64(np.prod(shape))

    def launch(x, kept, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, kept, y, total))

    name = "add" + (f" + {activation_label(activation)}" if activation else "")
    return AddOp(name, "add", "add_kept", launch, tuple(shape), compiled.seconds,
                 layout=check_layout(layout), output_dtype=np.dtype(out_dtype))


def reference_add(x: np.ndarray, kept: np.ndarray, activation: str | None = None) -> Reference:
    """The float64 result: one float32 addition of two terms (the rule's n = 2, magnitude
    |x| + |kept|); ReLU passes its error through no larger."""
    x64, k64 = (np.asarray(values(a), dtype=np.float64) for a in (x, kept))
    return Reference(apply_activation(x64 + k64, activation), np.abs(x64) + np.abs(k64), 2,
                     activation_absolute(activation))
