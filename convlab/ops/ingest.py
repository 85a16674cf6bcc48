"""8-bit images in, the first conv's input out: conversion, the model's normalisation, resampling
and layout in one device kernel, so images cross to the device as bytes (4x fewer than float32,
12x fewer for the ECE408 model's 48x48 input made from 28x28 images).

`normalize` is the host's float32 path for the same images, and the definition the kernel
matches bit for bit: every value is computed in float64 in one fixed order of IEEE operations
(no fused multiply-add on either side), rounded once to float32 and then, for an fp16 or bf16
first conv, converted as the staging kernels convert float32. Predictions from the uploaded
bytes are therefore those of the float32 path on the same images.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..gpu.elements import STAGE_ELEMENT_SOURCE, STAGE_MODES
from ..gpu.jit import build_options, load_module
from ..shapes import is_channels_last

SOURCE = r"""
// One thread per output element, in the target's memory order, so the stores of a warp are
// contiguous (NCHW: pixels of one channel; NHWC: the channels of one pixel, padding included).
// A value is ((double)u - MEAN[c]) / SCALE[c] of the source byte, bilinearly resampled (two taps
// per axis, rows first) where the output size differs from the image's, rounded to float32 and
// converted to the element type. The __d*_rn intrinsics keep NVRTC from fusing a multiply and
// an add, so the arithmetic is the host reference's, operation for operation.
//
// Compile-time: SH, SW, SC (image rows, columns, channels: bytes (N, SH, SW, SC)), C (output
// channels, padding included), H, W (output size), NHWC, RESAMPLE, MODE (element type).
""" + STAGE_ELEMENT_SOURCE + r"""
__device__ __forceinline__ double pixel(const unsigned char* __restrict__ image, int row, int col,
                                        int s, double mean, double scale)
{
    return __ddiv_rn(__dsub_rn((double)image[(row * SW + col) * SC + s], mean), scale);
}

extern "C" __global__ void ingest(const unsigned char* __restrict__ u, elem_t* __restrict__ y,
                                  const int* __restrict__ source, const double* __restrict__ mean,
                                  const double* __restrict__ scale, const int* __restrict__ taps,
                                  const double* __restrict__ weights, long long total)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
#if NHWC
        const int c = (int)(i % C);
        const long long pixel_index = i / C;
        const int x = (int)(pixel_index % W);
        const long long rows = pixel_index / W;
        const int yrow = (int)(rows % H);
        const long long b = rows / H;
#else
        const int x = (int)(i % W);
        const long long rows = i / W;
        const int yrow = (int)(rows % H);
        const long long plane = rows / H;
        const int c = (int)(plane % C);
        const long long b = plane / C;
#endif
        const int s = source[c];
        float v = 0.0f;
        if (s >= 0) {
            const unsigned char* __restrict__ image = u + b * (SH * SW * SC);
            const double m = mean[c], d = scale[c];
#if RESAMPLE
            // taps: row lo, row hi, column lo, column hi per output row / column; weights alike
            const int rlo = taps[yrow], rhi = taps[H + yrow];
            const int clo = taps[2 * H + x], chi = taps[2 * H + W + x];
            const double wrlo = weights[yrow], wrhi = weights[H + yrow];
            const double wclo = weights[2 * H + x], wchi = weights[2 * H + W + x];
            const double tlo = __dadd_rn(__dmul_rn(wrlo, pixel(image, rlo, clo, s, m, d)),
                                         __dmul_rn(wrhi, pixel(image, rhi, clo, s, m, d)));
            const double thi = __dadd_rn(__dmul_rn(wrlo, pixel(image, rlo, chi, s, m, d)),
                                         __dmul_rn(wrhi, pixel(image, rhi, chi, s, m, d)));
            v = __double2float_rn(__dadd_rn(__dmul_rn(wclo, tlo), __dmul_rn(wchi, thi)));
#else
            v = __double2float_rn(pixel(image, yrow, x, s, m, d));
#endif
        }
        y[i] = convert(v);
    }
}
"""

THREADS = 256
MAX_BLOCKS = 1 << 20  # the loop strides over the rest


@dataclass(frozen=True)
class InputTransform:
    """How a model turns 8-bit images (N, rows, cols, channels) into its float32 input
    (N, C, size, size): output channel c is source channel `channels[c]`, minus `mean[c]`,
    divided by `scale[c]`, resampled bilinearly to `size` (half-pixel centres, clamped edges)."""

    image_shape: tuple[int, int, int]  # rows, columns, channels of an uploaded image
    size: int
    channels: tuple[int, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]

    @property
    def resample(self) -> bool:
        return self.image_shape[:2] != (self.size, self.size)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """(taps, weights): rows lo, rows hi, columns lo, columns hi, concatenated."""
        rows, cols = (bilinear_taps(self.size, n) for n in self.image_shape[:2])
        taps = np.concatenate([rows[0], rows[1], cols[0], cols[1]]).astype(np.int32)
        weights = np.concatenate([rows[2], rows[3], cols[2], cols[3]])
        return taps, weights


def bilinear_taps(n_out: int, n_in: int):
    """For each output sample: (lower input, upper input, lower weight, upper weight), half-pixel
    centres clamped to the edges (the upper tap repeats the edge there, with weight 0)."""
    centres = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0, n_in - 1)
    lo = np.floor(centres).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = centres - lo
    return lo, hi, 1.0 - frac, frac


def as_images(u8: np.ndarray) -> np.ndarray:
    """(N, rows, cols) grey images as (N, rows, cols, 1); (N, rows, cols, channels) as given."""
    return u8[..., None] if u8.ndim == 3 else u8


def normalize(u8: np.ndarray, transform: InputTransform) -> np.ndarray:
    """The float32 NCHW network input of 8-bit images, on the host: what `ingest` computes."""
    u = as_images(u8)
    if u.shape[1:] != transform.image_shape:
        raise ValueError(f"images of shape {u.shape[1:]}, the transform takes "
                         f"{transform.image_shape}")
    x = np.empty((len(u), len(transform.channels), transform.size, transform.size), np.float32)
    for c, (s, m, d) in enumerate(zip(transform.channels, transform.mean, transform.scale)):
        v = (u[..., s].astype(np.float64) - m) / d
        if transform.resample:
            rlo, rhi, wrlo, wrhi = bilinear_taps(transform.size, v.shape[1])
            clo, chi, wclo, wchi = bilinear_taps(transform.size, v.shape[2])
            t = wrlo[:, None] * v[:, rlo, :] + wrhi[:, None] * v[:, rhi, :]
            v = wclo * t[:, :, clo] + wchi * t[:, :, chi]
        x[:, c] = v
    return x


@dataclass(frozen=True)
class Target:
    """What the ingest kernel writes: the first conv's input as that conv reads it."""

    channels: int  # padding included
    nhwc: bool
    maths: str  # "fp32" (float32), "fp16" or "bf16" bits

    @classmethod
    def of(cls, staged) -> "Target":
        """The target matching a staged array (logical (B, C, H, W), NCHW or channels-last)."""
        maths = {np.dtype(np.float16): "fp16", np.dtype(np.uint16): "bf16"}.get(
            np.dtype(staged.dtype), "fp32")
        return cls(staged.shape[1], is_channels_last(staged) and not staged.flags.c_contiguous,
                   maths)


def source_channels(transform: InputTransform, target: Target, groups: int) -> np.ndarray:
    """For each output channel, the model input channel it holds, or -1 for a padding channel
    (each of `groups` groups padded to target.channels / groups)."""
    real = len(transform.channels)
    padded = target.channels // groups
    per_group = real // groups
    src = np.full(target.channels, -1, dtype=np.int32)
    for c in range(target.channels):
        g, k = divmod(c, padded)
        if k < per_group:
            src[c] = g * per_group + k
    return src


def defines(transform: InputTransform, target: Target) -> dict[str, int]:
    rows, cols, channels = transform.image_shape
    return {"SH": rows, "SW": cols, "SC": channels, "C": target.channels, "H": transform.size,
            "W": transform.size, "NHWC": int(target.nhwc), "RESAMPLE": int(transform.resample),
            "MODE": STAGE_MODES.get(target.maths, 0)}


@lru_cache(maxsize=32)
def _kernel(options: tuple[str, ...]):
    return load_module("ops.ingest", SOURCE, options, ("ingest",)).module.get_function("ingest")


class Ingest:
    """The compiled kernel for one transform and target; `ingest(u, out)` turns device bytes
    u (N, rows, cols[, channels]) into `out`, the target array of N images, on the current
    stream. Nothing in a call allocates or synchronises (a CUDA graph can hold it)."""

    def __init__(self, transform: InputTransform, target: Target, groups: int = 1):
        import cupy

        self.transform, self.target = transform, target
        self.kernel = _kernel(build_options(defines(transform, target)))
        model = source_channels(transform, target, groups)
        real = np.maximum(model, 0)  # padding channels read nothing; any entry serves
        image = np.array(transform.channels, np.int32)[real]
        self.source = cupy.asarray(np.where(model >= 0, image, -1).astype(np.int32))
        self.mean = cupy.asarray(np.array(transform.mean, np.float64)[real])
        self.scale = cupy.asarray(np.array(transform.scale, np.float64)[real])
        taps, weights = transform.tables()
        self.taps, self.weights = cupy.asarray(taps), cupy.asarray(weights)

    def __call__(self, u, out) -> None:
        total = out.size
        blocks = max(1, min(MAX_BLOCKS, -(-total // THREADS)))
        self.kernel((blocks,), (THREADS,), (u, out, self.source, self.mean, self.scale, self.taps,
                                            self.weights, np.int64(total)))
