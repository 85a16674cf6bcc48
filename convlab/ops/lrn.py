"""LRN across channels (Caffe's definition), alone or fused with the max-pool that follows it."""

SOURCE = r"""
// LRN: y[c] = x[c] * (k + alpha/size * sum x[j]^2)^-beta, the sum over the SIZE channels
// j = c-BEFORE ... c-BEFORE+SIZE-1 at the same pixel, clipped to 0..C-1 (Caffe's definition).
// Each thread owns a pixel and walks a range of channels, holding that pixel's SIZE-channel
// window of x in registers: one new load per channel, so the input is read once from memory
// (plus SIZE-1 halo channels per channel range). The window sum is recomputed from the SIZE
// registers for every channel (SIZE FMAs) rather than updated by adding one square and
// subtracting another, which would cancel and make the error grow along the channels.
// Loads are coalesced: consecutive threads own consecutive pixels of a channel plane.
// Blocks split the channels into ranges of CB when the batch alone gives too few blocks to fill
// the GPU. The scalars alpha/size, k and -beta are run-time arguments.
// Compile-time: C, H, W, SIZE, BEFORE, CB, BLOCK; for the fused pool also HO, WO, PS, PST, TOH,
// TOW, IH, IW, NPIX, PPT, TILES_W.

// win holds x at channels c-BEFORE ... c-BEFORE+SIZE-1 of one pixel (0 outside 0..C-1).
// Before the first step at channel c0 it must hold channels c0-BEFORE-1 ... c0-BEFORE+SIZE-2.
__device__ __forceinline__ float channel(const float* __restrict__ px, int ch, bool inside)
{
    return (inside && ch >= 0 && ch < C) ? __ldg(px + ch * (H * W)) : 0.0f;
}

__device__ __forceinline__ void window_start(float (&win)[SIZE], const float* __restrict__ px,
                                             bool inside, int c0)
{
#pragma unroll
    for (int j = 1; j < SIZE; ++j) win[j] = channel(px, c0 - BEFORE + j - 1, inside);
}

// Slide the window to channel c and return the LRN value there.
__device__ __forceinline__ float window_step(float (&win)[SIZE], const float* __restrict__ px,
                                             bool inside, int c, float scale, float k,
                                             float neg_beta)
{
#pragma unroll
    for (int j = 0; j < SIZE - 1; ++j) win[j] = win[j + 1];
    win[SIZE - 1] = channel(px, c - BEFORE + SIZE - 1, inside);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < SIZE; ++j) sum = fmaf(win[j], win[j], sum);
    return win[BEFORE] * powf(fmaf(scale, sum, k), neg_beta);
}

// Grid: x over blocks of BLOCK pixels of a plane, y over channel ranges, z over images.
extern "C" __global__ void __launch_bounds__(BLOCK)
lrn(const float* __restrict__ x, float* __restrict__ y, float scale, float k, float neg_beta)
{
    const int p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= H * W) return;
    const int c0 = blockIdx.y * CB;
    const int c1 = min(C, c0 + CB);
    const long long image = (long long)blockIdx.z * (C * H * W);
    const float* __restrict__ px = x + image + p;
    float* __restrict__ out = y + image + p;
    float win[SIZE];
    window_start(win, px, true, c0);
    for (int c = c0; c < c1; ++c) out[c * (H * W)] = window_step(win, px, true, c, scale, k, neg_beta);
}

#ifdef PS
// LRN + max-pool: changes from lrn -- where a PS x PS / PST max-pool follows, a block owns a
// TOH x TOW tile of pooled outputs and the IH x IW input pixels under it (IH = (TOH-1)*PST + PS),
// PPT pixels per thread. For each channel the threads compute the LRN value of every pixel of
// the tile once, into shared memory, and then pool the tile from there: the LRN map never goes
// to global memory (it would be written and read back, two passes over the largest activation
// of the layer), and pixels shared by overlapping windows (3x3/2 covers most pixels twice) are
// normalised once, not once per window. LRN is not monotonic across a window (each pixel has its
// own channel neighbourhood), so the max is over the normalised values, as the layers define.
// Two shared planes alternate between channels: a thread that writes the next channel's plane
// while others still pool the current one touches the other plane, so one barrier per channel
// suffices (a plane is written again two channels later, after every thread passed the barrier
// that follows its last reads). Every thread runs every channel step: no early exit.
extern "C" __global__ void __launch_bounds__(BLOCK)
lrn_max_pool(const float* __restrict__ x, float* __restrict__ y, float scale, float k,
             float neg_beta)
{
    __shared__ float plane[2][NPIX];
    const int oh0 = (blockIdx.x / TILES_W) * TOH;
    const int ow0 = (blockIdx.x % TILES_W) * TOW;
    const int c0 = blockIdx.y * CB;
    const int c1 = min(C, c0 + CB);
    const long long b = blockIdx.z;
    const float* __restrict__ xb = x + b * (C * H * W);
    const float* px[PPT];
    bool inside[PPT];
    float win[PPT][SIZE];
#pragma unroll
    for (int t = 0; t < PPT; ++t) {
        const int p = threadIdx.x + t * BLOCK;
        const int h = oh0 * PST + p / IW;
        const int w = ow0 * PST + p % IW;
        // Tile pixels past the input feed only outputs past HO or WO, which are not stored.
        inside[t] = p < NPIX && h < H && w < W;
        px[t] = xb + (inside[t] ? h * W + w : 0);
        window_start(win[t], px[t], inside[t], c0);
    }
    for (int c = c0; c < c1; ++c) {
        float* buf = plane[(c - c0) & 1];
#pragma unroll
        for (int t = 0; t < PPT; ++t) {
            const float v = window_step(win[t], px[t], inside[t], c, scale, k, neg_beta);
            const int p = threadIdx.x + t * BLOCK;
            if (p < NPIX) buf[p] = v;
        }
        __syncthreads();
        for (int o = threadIdx.x; o < TOH * TOW; o += BLOCK) {
            const int oh = oh0 + o / TOW;
            const int ow = ow0 + o % TOW;
            if (oh < HO && ow < WO) {
                const float* src = buf + (o / TOW) * PST * IW + (o % TOW) * PST;
                float v = src[0];
#pragma unroll
                for (int i = 0; i < PS; ++i)
#pragma unroll
                    for (int j = 0; j < PS; ++j) v = fmaxf(v, src[i * IW + j]);
                y[((b * C + c) * HO + oh) * WO + ow] = v;
            }
        }
    }
}
#endif
"""

import numpy as np  # noqa: E402

from ..reference import lrn as lrn_float, max_pool  # noqa: E402
from ..verify import Reference  # noqa: E402
from .base import (ALLOWED_ULPS, KernelSpec, LayerOp, ceil_div, check_int32,  # noqa: E402
                   check_shape, compile_specs, probabilistic_share, sm_count, spec)
from .pool import max_pool_name, pooled_size  # noqa: E402

BLOCK = 256
MAX_TILE_PIXELS = 4 * BLOCK  # at most 4 pixels (4 channel windows) per thread
MIN_CHANNELS_PER_BLOCK = 4
BLOCKS_PER_SM = 4  # 1,024 threads of 256-thread blocks: the blocks a plan aims to give each SM
DEFAULT_SMS = 132  # H100 SXM; prepare passes the device's own count


def _check_lrn(in_shape, size: int, alpha: float, beta: float, k: float) -> tuple[int, ...]:
    B, C, H, W = check_shape(in_shape, 4, "LRN")
    if size < 1:
        raise ValueError(f"LRN needs a positive window size, got {size}")
    if alpha < 0 or k <= 0:
        raise ValueError(f"LRN needs alpha >= 0 and k > 0, got alpha {alpha}, k {k}")
    if B > 65535:
        raise ValueError(f"LRN launches one grid row per image; {B} images exceed 65,535")
    check_int32(C * H * W, "one image")
    return B, C, H, W


def channels_per_block(blocks_per_range: int, C: int, sms: int) -> int:
    """Channels a block walks: all C when the other grid dimensions already give BLOCKS_PER_SM
    blocks per SM, fewer (down to MIN_CHANNELS_PER_BLOCK, each range re-reading SIZE-1 halo
    channels) to make up the blocks when they do not (small batches)."""
    ranges = ceil_div(BLOCKS_PER_SM * sms, blocks_per_range)
    ranges = max(1, min(ranges, ceil_div(C, MIN_CHANNELS_PER_BLOCK)))
    return ceil_div(C, ranges)


def _lrn_defines(C: int, H: int, W: int, size: int, cb: int) -> dict[str, int]:
    return {"C": C, "H": H, "W": W, "SIZE": size, "BEFORE": (size - 1) // 2, "CB": cb,
            "BLOCK": BLOCK}


def lrn_kernel(in_shape, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0,
               sms: int = DEFAULT_SMS) -> KernelSpec:
    """The kernel prepare_lrn launches for this input shape."""
    B, C, H, W = _check_lrn(in_shape, size, alpha, beta, k)
    pixel_blocks = ceil_div(H * W, BLOCK)
    cb = channels_per_block(pixel_blocks * B, C, sms)
    return spec("ops.lrn", "lrn", SOURCE, _lrn_defines(C, H, W, size, cb),
                (pixel_blocks, ceil_div(C, cb), B), BLOCK)


def pool_tile(H: int, W: int, pool_size: int, pool_stride: int) -> tuple[int, int]:
    """(TOH, TOW): pooled outputs per block. The whole pooled width where its input rows fit
    MAX_TILE_PIXELS (halving it until they do), then as many pooled rows as fit: wide tiles keep
    the halo (the PS-PST input rows and columns two tiles share) small."""
    ho, wo = pooled_size(H, pool_size, pool_stride), pooled_size(W, pool_size, pool_stride)

    def span(n: int) -> int:
        return (n - 1) * pool_stride + pool_size

    tow = wo
    while tow > 1 and span(tow) * pool_size > MAX_TILE_PIXELS:
        tow = ceil_div(tow, 2)
    toh = 1
    while toh < ho and span(toh + 1) * span(tow) <= MAX_TILE_PIXELS:
        toh += 1
    return toh, tow


def lrn_max_pool_kernel(in_shape, size: int, alpha: float, beta: float, k: float,
                        pool_size: int, pool_stride: int, sms: int = DEFAULT_SMS) -> KernelSpec:
    """The kernel prepare_lrn_max_pool launches for this input shape."""
    B, C, H, W = _check_lrn(in_shape, size, alpha, beta, k)
    if pool_size < 1 or pool_stride < 1 or pool_size > min(H, W):
        raise ValueError(f"a {pool_size}x{pool_size}/{pool_stride} pool does not fit {H}x{W}")
    if pool_size * pool_size > MAX_TILE_PIXELS:
        raise ValueError(f"a {pool_size}x{pool_size} pool window exceeds the {MAX_TILE_PIXELS} "
                         f"pixels a block's tile holds")
    ho, wo = pooled_size(H, pool_size, pool_stride), pooled_size(W, pool_size, pool_stride)
    toh, tow = pool_tile(H, W, pool_size, pool_stride)
    ih, iw = (toh - 1) * pool_stride + pool_size, (tow - 1) * pool_stride + pool_size
    tiles = ceil_div(ho, toh) * ceil_div(wo, tow)
    cb = channels_per_block(tiles * B, C, sms)
    defines = _lrn_defines(C, H, W, size, cb) | {
        "HO": ho, "WO": wo, "PS": pool_size, "PST": pool_stride, "TOH": toh, "TOW": tow,
        "IH": ih, "IW": iw, "NPIX": ih * iw, "PPT": ceil_div(ih * iw, BLOCK),
        "TILES_W": ceil_div(wo, tow)}
    return spec("ops.lrn", "lrn_max_pool", SOURCE, defines, (tiles, ceil_div(C, cb), B), BLOCK)


def _scalars(size: int, alpha: float, beta: float, k: float) -> tuple:
    # alpha/size is rounded to float32 once, here (the bound counts that rounding).
    return np.float32(alpha / size), np.float32(k), np.float32(-beta)


def prepare_lrn(in_shape, size: int, alpha: float, beta: float, k: float) -> LayerOp:
    """Caffe's LRN across channels, x (B, C, H, W) -> y of the same shape (not in place)."""
    kernel_spec = lrn_kernel(in_shape, size, alpha, beta, k, sm_count())
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    scalars = _scalars(size, alpha, beta, k)

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y) + scalars)

    return LayerOp(f"LRN {size}", "lrn", "lrn", launch, tuple(in_shape), compiled.seconds)


def prepare_lrn_max_pool(in_shape, size: int, alpha: float, beta: float, k: float,
                         pool_size: int, pool_stride: int) -> LayerOp:
    """LRN, then a pool_size x pool_size / pool_stride max-pool, in one kernel that reads the
    input once and writes only the pooled map.

    Bytes through device memory, with N input elements and P pooled outputs: unfused, LRN reads
    N and writes N, and the pool reads those N again and writes P: 12N + 4P bytes. Fused: 4N +
    4P. Saved: 8N bytes. AlexNet norm1+pool1 (N = 96*55*55 = 290,400 per image): 2.32 MB per
    image, 297 MB at batch 128; norm2+pool2 (N = 256*27*27 = 186,624): 1.49 MB per image,
    191 MB at batch 128 - against 1.40 MB and 0.93 MB per image that the fused kernel moves.
    """
    kernel_spec = lrn_max_pool_kernel(in_shape, size, alpha, beta, k, pool_size, pool_stride,
                                      sm_count())
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    scalars = _scalars(size, alpha, beta, k)
    B, C, H, W = in_shape
    out_shape = (B, C, pooled_size(H, pool_size, pool_stride), pooled_size(W, pool_size, pool_stride))

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y) + scalars)

    return LayerOp(f"LRN {size} + {max_pool_name(pool_size, pool_stride)}", "lrn", "lrn_max_pool",
                   launch, out_shape, compiled.seconds)


def window_sums(x64: np.ndarray, size: int) -> np.ndarray:
    """S[b, c, h, w]: the sum of x^2 over channels c-before ... c-before+size-1, clipped."""
    before = (size - 1) // 2
    padded = np.pad(np.square(x64), ((0, 0), (before, size - 1 - before), (0, 0), (0, 0)))
    return np.lib.stride_tricks.sliding_window_view(padded, size, axis=1).sum(axis=-1)


def lrn_error_units(denominator: np.ndarray, size: int, beta: float) -> tuple[float, np.ndarray]:
    """The float32 LRN's relative error in units of u, as (the window sum's factor, the rest).

    The kernel computes S (the window's sum of squares, FMAs of non-negative terms: no
    cancellation), d = fmaf(alpha/size, S, k), p = powf(d, -beta) and y = x * p.
    - S: relative error LAMBDA*sqrt(size)*u in the probabilistic law verify.py uses (for
      size <= 64 that also exceeds the worst case, size*u).
    - d: the roundings of alpha/size, of k and of the FMA, each relative to a part of d or to
      d itself: 2u more at most.
    - p: a relative error e of d becomes beta*e; powf adds at most ALLOWED_ULPS ulps (2u each);
      beta rounded to float32 (relative u) scales d^-beta by at most exp(beta*u*|ln d|).
    - y: one rounding.
    So |y - ref| / |ref| <= beta*LAMBDA*sqrt(size)*u + (beta*(2 + |ln d|) + 2*ALLOWED + 1)*u,
    to first order (the second-order terms are below 1e-10 of the first).
    """
    rest = beta * (2.0 + np.abs(np.log(denominator))) + 2 * ALLOWED_ULPS["powf"] + 1
    return beta, rest


def _lrn_values_and_magnitude(x: np.ndarray, size: int, alpha: float, beta: float, k: float):
    x64 = np.asarray(x, dtype=np.float64)
    values = lrn_float(x64, size, alpha, beta, k)
    d = k + (alpha / size) * window_sums(x64, size)
    sum_factor, rest = lrn_error_units(d, size, beta)
    # Reference.bound = LAMBDA*sqrt(size)*u*magnitude: magnitude = |y| * (beta + rest/(LAMBDA*sqrt(size))).
    magnitude = np.abs(values) * (sum_factor + probabilistic_share(rest, size))
    return values, magnitude


def reference_lrn(x: np.ndarray, size: int, alpha: float, beta: float, k: float) -> Reference:
    """The float64 LRN and its bound (lrn_error_units derives it), n = size."""
    values, magnitude = _lrn_values_and_magnitude(x, size, alpha, beta, k)
    return Reference(values, magnitude, size)


def reference_lrn_max_pool(x: np.ndarray, size: int, alpha: float, beta: float, k: float,
                           pool_size: int, pool_stride: int) -> Reference:
    """The float64 LRN + max-pool. max is 1-Lipschitz in each argument: the pooled value is
    off by no more than the largest error in its window, so the pooled bound is the max of the
    window's LRN bounds (the bound grows with the magnitude, so: the max-pooled magnitude)."""
    values, magnitude = _lrn_values_and_magnitude(x, size, alpha, beta, k)
    return Reference(max_pool(values, pool_size, pool_stride),
                     max_pool(magnitude, pool_size, pool_stride), size)
