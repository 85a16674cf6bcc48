"""max-pool: any window and stride, floor mode, an optional activation applied to the result."""

from ..gpu.elements import ELEMENT_SOURCE, FLOAT32, element_defines
from .base import ACTIVATION_SOURCE

SOURCE = r"""
// max-pool: one thread per output element y[plane][oh][ow] (plane = image * C + channel), the
// max over its SIZE x SIZE window starting at (oh*STRIDE, ow*STRIDE) of the input plane: floor
// mode, no padding, so every window lies inside the input and no read needs a bounds check.
// Pooling moves no arithmetic worth optimising: it is bound by reading the input once, so the
// shape is chosen for coalescing. Consecutive threads take consecutive output columns: a warp
// reads 32 windows side by side (one contiguous span per window row, overlapping ones included,
// which the L1 serves), and writes 32 consecutive floats. ReLU and tanh are monotonic, so the
// activation the model applies before the pool is applied once to the pooled value instead
// (one tanh per output rather than per input; the input is read once either way).
// With NHWC (channels-last, C channels), consecutive threads take consecutive channels of one
// output pixel instead, which are adjacent in memory there, and a window step is C floats.
// fp16 in or out (IN_HALF, OUT_HALF): the max of fp16 values is one of them, so a pool between
// two fp16 convs gives the bits it gives in float32.
// Compile-time: H, W, HO, WO, SIZE, STRIDE, ACT, BLOCK, NHWC, C, IN_HALF, OUT_HALF. The flat
// output index is 64-bit.
""" + ACTIVATION_SOURCE + ELEMENT_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(BLOCK)
max_pool(const in_t* __restrict__ x, out_t* __restrict__ y, long long total)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) return;
#if NHWC
    const int c = (int)(i % C);
    const long long pixel = i / C;
    const int ow = (int)(pixel % WO);
    const long long rows = pixel / WO;
    const int oh = (int)(rows % HO);
    const long long image = rows / HO;
    const in_t* __restrict__ window =
        x + ((image * H + oh * STRIDE) * W + ow * STRIDE) * C + c;
#define STEP C
#else
    const int ow = (int)(i % WO);
    const long long rows = i / WO;
    const int oh = (int)(rows % HO);
    const long long plane = rows / HO;
    const in_t* __restrict__ window = x + plane * (H * W) + (oh * STRIDE) * W + ow * STRIDE;
#define STEP 1
#endif
    float v = load_in(window);
#pragma unroll
    for (int p = 0; p < SIZE; ++p)
#pragma unroll
        for (int q = 0; q < SIZE; ++q)
            v = fmaxf(v, load_in(window + (p * W + q) * STEP));
    y[i] = to_out(activate(v));
}
"""

import numpy as np  # noqa: E402

from ..oracle.reference import max_pool  # noqa: E402
from ..oracle.verify import Reference  # noqa: E402
from ..shapes import NCHW, NHWC  # noqa: E402
from .base import (KernelSpec, LayerOp, activation_absolute, activation_label,  # noqa: E402
                   apply_activation, ceil_div, check_activation, check_int32, check_layout,
                   check_shape, compile_specs, spec)

BLOCK = 256


def pooled_size(n: int, size: int, stride: int) -> int:
    return (n - size) // stride + 1


def max_pool_kernel(in_shape, size: int, stride: int, activation: str | None = None,
                    layout: str = NCHW, in_dtype=FLOAT32, out_dtype=FLOAT32) -> KernelSpec:
    """The kernel prepare_max_pool launches for this input shape (B, C, H, W) in `layout`."""
    B, C, H, W = check_shape(in_shape, 4, "max-pool")
    if size < 1 or stride < 1:
        raise ValueError(f"max-pool needs a positive size and stride, got {size}/{stride}")
    if size > H or size > W:
        raise ValueError(f"a {size}x{size} window does not fit a {H}x{W} input")
    check_int32(C * H * W, "one image")
    ho, wo = pooled_size(H, size, stride), pooled_size(W, size, stride)
    total = B * C * ho * wo
    defines = {"H": H, "W": W, "HO": ho, "WO": wo, "SIZE": size, "STRIDE": stride,
               "ACT": check_activation(activation), "BLOCK": BLOCK,
               "NHWC": int(check_layout(layout) == NHWC), "C": C,
               **element_defines(in_dtype, out_dtype)}
    return spec("ops.pool", "max_pool", SOURCE, defines, (ceil_div(total, BLOCK),), BLOCK)


def max_pool_name(size: int, stride: int, activation: str | None = None) -> str:
    pool = f"max-pool {size}x{size}/{stride}"
    return f"{activation_label(activation)} + {pool}" if activation else pool


def prepare_max_pool(in_shape, size: int, stride: int, activation: str | None = None,
                     layout: str = NCHW, in_dtype=FLOAT32, out_dtype=FLOAT32) -> LayerOp:
    """y = activation(max-pool(x)): x (B, C, H, W) -> (B, C, (H-size)//stride+1, ...), both in
    `layout` (NCHW or NHWC memory), x of `in_dtype` and y of `out_dtype` (float32 or float16)."""
    kernel_spec = max_pool_kernel(in_shape, size, stride, activation, layout, in_dtype,
                                  out_dtype)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    B, C, H, W = in_shape
    out_shape = (B, C, pooled_size(H, size, stride), pooled_size(W, size, stride))
    total = np.int64(np.prod(out_shape))

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y, total))

    return LayerOp(max_pool_name(size, stride, activation), "pool", "max_pool", launch,
                   out_shape, compiled.seconds, layout=layout, output_dtype=np.dtype(out_dtype))


def reference_max_pool(x: np.ndarray, size: int, stride: int,
                       activation: str | None = None) -> Reference:
    """The float64 result. A max of float32 values is one of them, exactly, and so is ReLU of
    it: the bound is zero (Reference adds only n*TINY). tanhf adds its own error, which
    TANH_ABSOLUTE allows."""
    values = apply_activation(max_pool(np.asarray(x, dtype=np.float64), size, stride), activation)
    return Reference(values, np.zeros_like(values), 1, activation_absolute(activation))
