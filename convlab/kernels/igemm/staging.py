"""The implicit GEMMs' input staging: an input converted to what the kernel reads (fp16 or bf16
bits; channels-last kernels also channels-last with each group's channels padded), outside
the timed region or into a buffer a CUDA graph replays, by a Staging that names that buffer
before any input exists. Where images enter a network (NCHW float32 in, the padded NHWC
tensor of the kernel's element type out) one pass of our own does it, nchw_to_nhwc: CuPy's
strided copy did the same in 0.12 ms for AlexNet's batch of 128 (79 MB in, 105 MB out: twice
the time of the bytes on an H100), inside the forward pass."""

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...gpu.elements import STAGE_ELEMENT_SOURCE, STAGE_MODES as MODES
from ...gpu.jit import build_options, load_module
from ...shapes import NCHW, NHWC, ConvShape, channels_last, dense_in, is_channels_last
from ..base import Staging, StagedBuffer
from .tiling import channel_vector

SOURCE = r"""
// One thread per VEC output channels of one pixel, all of one group (GC, the padded channels
// per group, is a multiple of VEC). Its VEC loads lie HW apart, but the warp's threads load
// neighbouring pixels of each channel, so each load instruction is coalesced while a pixel has
// few vectors (an image's 1-4 channels); the store is one 8- or 16-byte vector. Padding
// channels are written as zeros, so the output needs no clearing first.
//
// Compile-time: C, CG (channels, per group), G (groups), GC (padded per group), HW (pixels per
// image), VEC, MODE.
""" + STAGE_ELEMENT_SOURCE + r"""
#if VEC * ELEM_BYTES == 16
typedef uint4 vec_t;
#else
typedef uint2 vec_t;
#endif
#define NV (G * GC / VEC)

extern "C" __global__ void stage_nhwc(const float* __restrict__ x, vec_t* __restrict__ y,
                                      long long vectors)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < vectors;
         i += (long long)gridDim.x * blockDim.x) {
        const long long pixel = i / NV;
        const int v = (int)(i - pixel * NV);
        const long long b = pixel / HW;
        const int p = (int)(pixel - b * HW);
        const int g = v * VEC / GC, c0 = v * VEC - g * GC;
        union {
            vec_t v;
            elem_t e[VEC];
        } out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const int c = c0 + k;
            out.e[k] = convert(c < CG ? __ldg(x + ((b * C + g * CG + c) * HW + p)) : 0.0f);
        }
        y[i] = out.v;
    }
}
"""

THREADS = 256
MAX_BLOCKS = 1 << 20  # the loop strides over the rest


def defines(C: int, groups: int, group_channels: int, hw: int, vec: int, maths: str) -> dict:
    return {"C": C, "CG": C // groups, "G": groups, "GC": group_channels, "HW": hw, "VEC": vec,
            "MODE": MODES.get(maths, 0)}


@lru_cache(maxsize=64)
def nchw_to_nhwc(C: int, groups: int, group_channels: int, hw: int, vec: int, maths: str):
    """The compiled kernel for one input geometry; launch(x, out) stages contiguous NCHW
    float32 x into out's contiguous NHWC memory (both CuPy arrays, out of the stage dtype)."""
    options = build_options(defines(C, groups, group_channels, hw, vec, maths))
    kernel = load_module("stage-nhwc", SOURCE, options, ("stage_nhwc",)).module \
        .get_function("stage_nhwc")

    def launch(x, out):
        vectors = out.size // vec
        blocks = max(1, min(MAX_BLOCKS, -(-vectors // THREADS)))
        kernel((blocks,), (THREADS,), (x, out, np.int64(vectors)))

    return launch


# --- staging inputs (outside the timed region, or into a buffer a CUDA graph replays) --------

@lru_cache(maxsize=1)
def _bf16_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "float32 x", "uint16 y",
        "unsigned int u = __float_as_uint(x);"
        " y = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);",
        "convlab_float_to_bf16")


def _convert(x, out, maths: str):
    """x (any strides) into out (same shape), as the maths reads it: fp16 rounded to nearest,
    bf16 bits rounded to nearest even, float32 copied. bf16 bits in (an activation a bf16
    network wrote) are copied as they are: they are no integers to convert."""
    import cupy

    if maths == "bf16" and x.dtype != np.uint16:
        _bf16_kernel()(x.astype(cupy.float32, copy=False), out)
    else:
        cupy.copyto(out, x, casting="unsafe")


def stage_dtype(maths: str):
    # bf16 bit patterns: neither NumPy nor CuPy has a bfloat16 dtype
    return {"fp16": np.float16, "bf16": np.uint16}.get(maths, np.float32)


def stage_nchw(x, out, maths: str):
    """The NCHW input as fp16 / bf16 (one conversion; `out`, if given, receives it). An input
    that is already that (what ops.ingest writes from 8-bit images) is used as it is."""
    import cupy

    if x.dtype == stage_dtype(maths) and x.flags.c_contiguous:
        return x
    if (out is None or out.shape != x.shape or out.dtype != stage_dtype(maths)
            or not out.flags.c_contiguous):
        out = cupy.empty(x.shape, dtype=stage_dtype(maths))
    _convert(x, out, maths)
    return out


def stage_channels_last(x, out, shape: ConvShape, group_channels: int, maths: str):
    """A logical (B, C, H, W) input, NCHW or channels-last, as the channels-last kernel reads
    it: memory (B, H, W, G*group_channels) of the maths' element type, each group's channels
    padded with zeros to `group_channels`. An input that is already that is used as it is;
    otherwise `out` receives it: one allocated here where it is None or not that tensor, and
    a given one gets its padding written too (a network's arena hands over bytes other steps
    wrote). Contiguous NCHW float32 (images as they enter) takes nchw_to_nhwc."""
    import cupy

    dtype = stage_dtype(maths)
    if x.dtype == dtype and x.shape[1] == shape.groups * group_channels and is_channels_last(x):
        return x
    B, _, H, W = x.shape
    G = shape.groups
    staged = (B, G * group_channels, H, W)
    if out is not None and (out.shape != staged or out.dtype != dtype
                            or not is_channels_last(out)):
        out = None
    if x.dtype == np.float32 and x.flags.c_contiguous:
        # images entering the network (NCHW memory, also when C == 1): one kernel of ours,
        # which writes the padding too
        if out is None:
            out = channels_last(cupy.empty(staged, dtype=dtype))
        vec = channel_vector(group_channels, maths)
        nchw_to_nhwc(shape.C, G, group_channels, H * W, vec, maths)(x, out)
        return out
    if out is None:  # zeroed once: the padding channels are never written below
        out = channels_last(cupy.zeros(staged, dtype=dtype))
    elif group_channels != shape.Cg:  # a buffer shared with other steps (a network's arena)
        out.transpose(0, 2, 3, 1).reshape(B, H, W, G, group_channels)[..., shape.Cg:] = 0
    memory = out.transpose(0, 2, 3, 1)
    if is_channels_last(x) and group_channels == shape.Cg:  # a conversion of the type only
        _convert(x.transpose(0, 2, 3, 1).reshape(-1), memory.reshape(-1), maths)
    else:
        source = x.transpose(0, 2, 3, 1).reshape(B, H, W, G, shape.Cg)
        _convert(source, memory.reshape(B, H, W, G, group_channels)[..., :shape.Cg], maths)
    return out


@dataclass(frozen=True)
class ChannelsLastStaging(Staging):
    """stage_channels_last for one layer, as an Op's stage_input."""

    shape: ConvShape
    group_channels: int
    maths: str

    def __call__(self, x, out):
        return stage_channels_last(x, out, self.shape, self.group_channels, self.maths)

    def buffer(self, dtype, shape, layout):
        B, C, H, W = shape
        channels = self.shape.groups * self.group_channels
        passes = (np.dtype(dtype) == np.dtype(stage_dtype(self.maths)) and C == channels
                  and dense_in(NHWC, shape, layout))
        return None if passes else StagedBuffer((B, channels, H, W),
                                                np.dtype(stage_dtype(self.maths)), NHWC)


@dataclass(frozen=True)
class NchwStaging(Staging):
    """stage_nchw in the maths' element type, as an Op's stage_input."""

    maths: str

    def __call__(self, x, out):
        return stage_nchw(x, out, self.maths)

    def buffer(self, dtype, shape, layout):
        passes = (np.dtype(dtype) == np.dtype(stage_dtype(self.maths))
                  and dense_in(NCHW, shape, layout))
        return None if passes else StagedBuffer(tuple(shape), np.dtype(stage_dtype(self.maths)),
                                                NCHW)
