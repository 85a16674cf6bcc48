"""max-pool (any window, stride and padding, floor mode, an optional activation applied to the
result) and the global average pool."""

from ..gpu.elements import ELEMENT_SOURCE, FLOAT32, element_defines, values as element_values
from .base import ACTIVATION_SOURCE

SOURCE = r"""
// max-pool: one thread per output element y[plane][oh][ow] (plane = image * C + channel), the
// max over its SIZE x SIZE window starting at (oh*STRIDE - PAD, ow*STRIDE - PAD) of the input
// plane, floor mode. Without padding every window lies inside the input and no read needs a
// bounds check (PAD is a constant: the checks compile away); with it, taps outside the plane
// are -infinity, PyTorch's padding, and are skipped.
// Pooling moves no arithmetic worth optimising: it is bound by reading the input once, so the
// shape is chosen for coalescing. Consecutive threads take consecutive output columns: a warp
// reads 32 windows side by side (one contiguous span per window row, overlapping ones included,
// which the L1 serves), and writes 32 consecutive floats. ReLU and tanh are monotonic, so the
// activation the model applies before the pool is applied once to the pooled value instead
// (one tanh per output rather than per input; the input is read once either way).
// With NHWC (channels-last, C channels), consecutive threads take consecutive channels of one
// output pixel instead, which are adjacent in memory there, and a window step is C elements.
// Where C is a multiple of VEC (the channels 16 bytes of the input hold: 4 float32, 8 16-bit),
// each thread takes VEC adjacent channels: one 16-byte load per tap and one store of VEC
// outputs. With one channel a thread, fp16's loads were 2 bytes wide and VGG-16's first pool
// (64 x 64 x 224 x 224) moved its 514 MB at 2.6 TB/s, about 60% of what the H200 copies
// (results/h200/resnet50-vgg16-classes-20261128/run-vgg16-wgmma-fp16-b64-20261128T170931.json).
// fp16 in or out (IN_HALF, OUT_HALF): the max of fp16 values is one of them, so a pool between
// two fp16 convs gives the bits it gives in float32.
// Compile-time: H, W, HO, WO, SIZE, STRIDE, PAD, ACT, BLOCK, NHWC, C, VEC, IN_HALF, OUT_HALF.
// `total` counts threads (outputs / VEC); the flat indices are 64-bit.
""" + ACTIVATION_SOURCE + ELEMENT_SOURCE + r"""
// The running max of N adjacent channels with the N elements at p (16 aligned bytes when N > 1).
// Templates, so that the branch for the other element width is never instantiated.
template <class Element, int N>
__device__ __forceinline__ void max_into(float (&v)[N], const typename Element::bits* __restrict__ p)
{
    if constexpr (N == 1) {
        v[0] = fmaxf(v[0], Element::value(__ldg(p)));
    } else {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
        const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if constexpr (sizeof(typename Element::bits) == 2) {
                float lo, hi;
                Element::unpack(words[k], lo, hi);
                v[2 * k] = fmaxf(v[2 * k], lo);
                v[2 * k + 1] = fmaxf(v[2 * k + 1], hi);
            } else {
                v[k] = fmaxf(v[k], __uint_as_float(words[k]));
            }
        }
    }
}

// N outputs at y, rounded into Element: 8, 16 or 32 aligned bytes when N > 1.
template <class Element, int N>
__device__ __forceinline__ void store_outputs(typename Element::bits* __restrict__ y, const float (&v)[N])
{
    if constexpr (N == 1) {
        y[0] = Element::from(v[0]);
    } else {
        constexpr int WORDS = N * (int)sizeof(typename Element::bits) / 4;
        unsigned w[WORDS];
#pragma unroll
        for (int k = 0; k < WORDS; ++k) {
            if constexpr (sizeof(typename Element::bits) == 2)
                w[k] = Element::from(v[2 * k]) | ((unsigned)Element::from(v[2 * k + 1]) << 16);
            else
                w[k] = __float_as_uint(Element::from(v[k]));
        }
        if constexpr (WORDS == 2) {
            *reinterpret_cast<uint2*>(y) = make_uint2(w[0], w[1]);
        } else {
#pragma unroll
            for (int k = 0; k < WORDS; k += 4)
                reinterpret_cast<uint4*>(y)[k / 4] = make_uint4(w[k], w[k + 1], w[k + 2], w[k + 3]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
max_pool(const in_t* __restrict__ x, out_t* __restrict__ y, long long total)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) return;
#if NHWC
    const int c = (int)(i % (C / VEC)) * VEC;
    const long long pixel = i / (C / VEC);
    const int ow = (int)(pixel % WO);
    const long long rows = pixel / WO;
    const int oh = (int)(rows % HO);
    const long long image = rows / HO;
    const int top = oh * STRIDE - PAD, left = ow * STRIDE - PAD;
    const in_t* __restrict__ window = x + ((image * H + top) * W + left) * C + c;
#define STEP C
#else
    const int ow = (int)(i % WO);
    const long long rows = i / WO;
    const int oh = (int)(rows % HO);
    const long long plane = rows / HO;
    const int top = oh * STRIDE - PAD, left = ow * STRIDE - PAD;
    const in_t* __restrict__ window = x + plane * (H * W) + top * W + left;
#define STEP 1
#endif
    float v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k)
        v[k] = __int_as_float(0xff800000);  // -infinity: NVRTC has no <math.h> INFINITY
#pragma unroll
    for (int p = 0; p < SIZE; ++p)
#pragma unroll
        for (int q = 0; q < SIZE; ++q)
            if (PAD == 0 || ((unsigned)(top + p) < (unsigned)H && (unsigned)(left + q) < (unsigned)W))
                max_into<InElement>(v, window + (p * W + q) * STEP);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
        v[k] = activate(v[k]);
    store_outputs<OutElement>(y + i * VEC, v);
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


def pooled_size(n: int, size: int, stride: int, pad: int = 0) -> int:
    return (n + 2 * pad - size) // stride + 1


def max_pool_kernel(in_shape, size: int, stride: int, activation: str | None = None,
                    layout: str = NCHW, in_dtype=FLOAT32, out_dtype=FLOAT32,
                    pad: int = 0) -> KernelSpec:
    """The kernel prepare_max_pool launches for this input shape (B, C, H, W) in `layout`."""
    B, C, H, W = check_shape(in_shape, 4, "max-pool")
    if size < 1 or stride < 1:
        raise ValueError(f"max-pool needs a positive size and stride, got {size}/{stride}")
    if not 0 <= pad <= size // 2:
        raise ValueError(f"max-pool padding must be 0 to half the window ({size // 2}), "
                         f"got {pad}")  # PyTorch's rule: every window then holds an input
    if size > H + 2 * pad or size > W + 2 * pad:
        raise ValueError(f"a {size}x{size} window does not fit a {H}x{W} input")
    check_int32(C * H * W, "one image")
    ho, wo = pooled_size(H, size, stride, pad), pooled_size(W, size, stride, pad)
    vec = channels_per_thread(C, layout, in_dtype)
    threads = B * C * ho * wo // vec
    defines = {"H": H, "W": W, "HO": ho, "WO": wo, "SIZE": size, "STRIDE": stride, "PAD": pad,
               "ACT": check_activation(activation), "BLOCK": BLOCK,
               "NHWC": int(check_layout(layout) == NHWC), "C": C, "VEC": vec,
               **element_defines(in_dtype, out_dtype)}
    return spec("ops.pool", "max_pool", SOURCE, defines, (ceil_div(threads, BLOCK),), BLOCK)


def channels_per_thread(channels: int, layout: str, in_dtype=FLOAT32) -> int:
    """VEC: the adjacent channels one thread pools, as many as 16 bytes of the input hold where
    the layout keeps channels adjacent (NHWC) and they divide the channel count, else one."""
    vec = 16 // np.dtype(in_dtype).itemsize
    return vec if check_layout(layout) == NHWC and channels % vec == 0 else 1


def max_pool_name(size: int, stride: int, activation: str | None = None, pad: int = 0) -> str:
    pool = f"max-pool {size}x{size}/{stride}{f' pad {pad}' if pad else ''}"
    return f"{activation_label(activation)} + {pool}" if activation else pool


def prepare_max_pool(in_shape, size: int, stride: int, activation: str | None = None,
                     layout: str = NCHW, in_dtype=FLOAT32, out_dtype=FLOAT32,
                     pad: int = 0) -> LayerOp:
    """y = activation(max-pool(x)): x (B, C, H, W) -> (B, C, (H+2*pad-size)//stride+1, ...),
    both in `layout` (NCHW or NHWC memory), x of `in_dtype` and y of `out_dtype` (float32 or
    float16)."""
    kernel_spec = max_pool_kernel(in_shape, size, stride, activation, layout, in_dtype,
                                  out_dtype, pad)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    B, C, H, W = in_shape
    out_shape = (B, C, pooled_size(H, size, stride, pad), pooled_size(W, size, stride, pad))
    vec = dict(kernel_spec.defines)["VEC"]
    threads = np.int64(np.prod(out_shape) // vec)

    def launch(x, y):
        if vec > 1 and (x.data.ptr % 16 or y.data.ptr % 16):
            raise ValueError("a channels-last max-pool's input and output must start on a "
                             "16-byte boundary")
        kernel(kernel_spec.grid, kernel_spec.block, (x, y, threads))

    return LayerOp(max_pool_name(size, stride, activation, pad), "pool", "max_pool", launch,
                   out_shape, compiled.seconds, layout=layout, output_dtype=np.dtype(out_dtype))


def reference_max_pool(x: np.ndarray, size: int, stride: int,
                       activation: str | None = None, pad: int = 0) -> Reference:
    """The float64 result. A max of float32 values is one of them, exactly, and so is ReLU of
    it: the bound is zero (Reference adds only n*TINY). tanhf adds its own error, which
    TANH_ABSOLUTE allows."""
    x64 = np.asarray(element_values(x), dtype=np.float64)
    values = apply_activation(max_pool(x64, size, stride, pad), activation)
    return Reference(values, np.zeros_like(values), 1, activation_absolute(activation))


GLOBAL_SOURCE = r"""
// global average pool: one thread per (image, channel), the mean of its H x W plane, summed in
// float32 in plane order. ResNet's is 7 x 7: a few hundred thousand threads each summing 49
// values, read once, so the shape is chosen for coalescing where the layout allows it. With
// NHWC (channels-last) consecutive threads take consecutive channels and a warp reads 32
// adjacent values per pixel; with NCHW each thread reads its own contiguous plane, and the
// warp's 32 planes meet in L1/L2.
// Compile-time: C, HW, BLOCK, NHWC, IN_HALF, OUT_HALF.
""" + ELEMENT_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(BLOCK)
global_avg_pool(const in_t* __restrict__ x, out_t* __restrict__ y, long long total)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) return;
    const long long image = i / C;
    const int c = (int)(i % C);
#if NHWC
    const in_t* __restrict__ p = x + image * (long long)HW * C + c;
#define STEP C
#else
    const in_t* __restrict__ p = x + i * HW;
#define STEP 1
#endif
    float sum = 0.0f;
    for (int k = 0; k < HW; ++k)
        sum += load_in(p + k * STEP);
    y[i] = to_out(sum / HW);
}
"""


def global_avg_pool_kernel(in_shape, layout: str = NCHW, in_dtype=FLOAT32,
                           out_dtype=FLOAT32) -> KernelSpec:
    B, C, H, W = check_shape(in_shape, 4, "global average pool")
    check_int32(C * H * W, "one image")
    defines = {"C": C, "HW": H * W, "BLOCK": BLOCK, "NHWC": int(check_layout(layout) == NHWC),
               **element_defines(in_dtype, out_dtype)}
    return spec("ops.pool", "global_avg_pool", GLOBAL_SOURCE, defines,
                (ceil_div(B * C, BLOCK),), BLOCK)


def prepare_global_avg_pool(in_shape, layout: str = NCHW, in_dtype=FLOAT32,
                            out_dtype=FLOAT32) -> LayerOp:
    """y (B, C) = the mean of every plane of x (B, C, H, W) in `layout`, x of `in_dtype`, y of
    `out_dtype`."""
    kernel_spec = global_avg_pool_kernel(in_shape, layout, in_dtype, out_dtype)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    total = np.int64(in_shape[0] * in_shape[1])

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y, total))

    return LayerOp("global avg-pool", "pool", "global_avg_pool", launch,
                   tuple(in_shape[:2]), compiled.seconds, output_dtype=np.dtype(out_dtype))


def reference_global_avg_pool(x: np.ndarray) -> Reference:
    """The float64 mean of each plane. The float32 sum of n = H*W terms errs as a conv's sum of
    n terms does, relative to the sum of |x|; the division by n is one more rounding, within
    the rule's allowance at n >= 1."""
    x64 = np.asarray(element_values(x), dtype=np.float64)
    n = x64.shape[2] * x64.shape[3]
    return Reference(x64.mean(axis=(2, 3)), np.abs(x64).mean(axis=(2, 3)), n + 1)
