"""The channels-last kernels' input staging where images enter a network: NCHW float32 in, the
padded NHWC tensor of the kernel's element type out, in one pass of our own. CuPy's strided
copy did the same in 0.12 ms for AlexNet's batch of 128 (79 MB in, 105 MB out: twice the time
of the bytes on an H100), inside the forward pass."""

from functools import lru_cache

import numpy as np

from ...gpu.elements import STAGE_ELEMENT_SOURCE, STAGE_MODES as MODES
from ...gpu.jit import build_options, load_module

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
