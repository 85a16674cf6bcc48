"""The im2col B operand, gathered on the fly from the NCHW input (NchwGather): each thread's
pixel columns, then a K-tile's elements of them: with GATHER_TAP the K order is
(channel chunk, tap, channel) and a column's elements of one K-tile share one tap; otherwise K
runs in the weights' (c, p, q) order through `gather_table`'s offsets. 4-byte elements go
straight to shared memory by cp.async; fp16/bf16 pass through registers."""

import numpy as np

from ...shapes import ConvShape
from .tiling import INVALID_TAP, Tiling, k_tiles

# The gather as a type: a thread's share of every B tile, the pixel columns of the tile's unit
# it reads (`start`) and each K-tile's elements of them: by cp.async into the stage (`load`),
# or, for 2-byte elements, into registers (`fetch`) and from there into the stage (`store`).
NCHW_GATHER = r"""
struct NchwGather {
    // COLT threads side by side along the tile's pixels, each owning NCOLS pixel columns and
    // RPT consecutive k rows of every K-tile.
    int col0, r0;
    long long off[NCOLS];
    int ih0[NCOLS], iw0[NCOLS];
#if HALF
    elem_t bv[NCOLS][RPT];  // the next K-tile's B elements, in flight while this one computes
#endif

    __device__ __forceinline__ explicit NchwGather(int tid)
        : col0(tid % COLT), r0((tid / COLT) * RPT) {}

    // Where this thread's pixel columns of the unit's tile have their receptive field start. A
    // column past the last pixel gets a row origin that fails every bounds test, so it gathers
    // zeros.
    __device__ __forceinline__ void start(const TileUnit& unit, int npix)
    {
#pragma unroll
        for (int i = 0; i < NCOLS; ++i) {
            const int n = unit.ntile * BN + col0 + i * COLT;
            if (n < npix) {
                const int b = n / HWO, r = n - b * HWO;
                const int ho = r / WO, wo = r - ho * WO;
                ih0[i] = ho * STRIDE - PAD_H;
                iw0[i] = wo * STRIDE - PAD_W;
                off[i] = ((long long)b * C + unit.group * CG) * HWI + ih0[i] * W + iw0[i];
            } else {
                ih0[i] = -(1 << 29);
                iw0[i] = 0;
                off[i] = 0;
            }
        }
    }

    // Whether column i reads inside the image at a tap dp rows and dq columns into the window
    // (its index times DIL): without padding every tap of a real pixel lies inside the image
    // (ho*S + dp <= H-1 by the definition of HO), so only columns past the last pixel
    // (ih0 < 0) and, for the table, k past the reduction gather zeros, and the table's offsets
    // are all a k needs. A function here, where the channels-last gather writes its test out
    // (NhwcGather::load says why): no shipped tiling is of this family, so the two forms were
    // not timed against each other, and this one is the one that ran the GPU tests.
    __device__ __forceinline__ bool in_image(int i, int dp, int dq) const
    {
        return PAD_H == 0 && PAD_W == 0
            ? ih0[i] >= 0
            : (unsigned)(ih0[i] + dp) < (unsigned)H && (unsigned)(iw0[i] + dq) < (unsigned)W;
    }

#if HALF
    // K-tile kt's elements of this thread's columns into bv.
    __device__ __forceinline__ void fetch(const elem_t* __restrict__ x,
                                          const int4* __restrict__ table, int kt)
    {
#if GATHER_TAP
        const int cc = kt / KK, tap = kt - cc * KK, row = tap / KW;
        const int p = row * DIL, q = (tap - row * KW) * DIL;
        const int c0 = cc * BK + r0;
#pragma unroll
        for (int i = 0; i < NCOLS; ++i) {
            const bool ok = in_image(i, p, q);
            const elem_t* src = x + (off[i] + (c0 * HWI + p * W + q));
#pragma unroll
            for (int j = 0; j < RPT; ++j) {
                const bool okj = ok && (CG % BK == 0 || c0 + j < CG);
                bv[i][j] = okj ? __ldg(src + j * HWI) : (elem_t)0;
            }
        }
#else
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const int k = kt * BK + r0 + j;
#if PAD_H == 0 && PAD_W == 0
            const int offset = __ldg(reinterpret_cast<const int*>(table) + 4 * k);
#pragma unroll
            for (int i = 0; i < NCOLS; ++i) {
                const bool ok = in_image(i, 0, 0) && k < CG * KK;
                bv[i][j] = ok ? __ldg(x + (off[i] + offset)) : (elem_t)0;
            }
#else
            const int4 e = __ldg(table + k);
#pragma unroll
            for (int i = 0; i < NCOLS; ++i) {
                const bool ok = in_image(i, e.y, e.z);
                bv[i][j] = ok ? __ldg(x + (off[i] + e.x)) : (elem_t)0;
            }
#endif
        }
#endif
    }

    // bv into the B tile of a stage.
    __device__ __forceinline__ void store(float* tile) const
    {
        elem_t* sb = reinterpret_cast<elem_t*>(tile);
#pragma unroll
        for (int i = 0; i < NCOLS; ++i)
#pragma unroll
            for (int j = 0; j < RPT; ++j) sb[(r0 + j) * B_LD + col0 + i * COLT] = bv[i][j];
    }
#else
    // K-tile kt of this thread's columns, by cp.async into the B tile `sb` of a stage.
    __device__ __forceinline__ void load(float* sb, const elem_t* __restrict__ x,
                                         const int4* __restrict__ table, int kt) const
    {
#if GATHER_TAP
        const int cc = kt / KK, tap = kt - cc * KK, row = tap / KW;
        const int p = row * DIL, q = (tap - row * KW) * DIL;
        const int c0 = cc * BK + r0;
#pragma unroll
        for (int i = 0; i < NCOLS; ++i) {
            const bool ok = in_image(i, p, q);
            const float* src = x + (off[i] + (c0 * HWI + p * W + q));
            const unsigned dst = smem_u32(sb + r0 * B_LD + col0 + i * COLT);
#pragma unroll
            for (int j = 0; j < RPT; ++j)
                cp_async4(dst + j * (B_LD * 4), src + j * HWI, ok && (CG % BK == 0 || c0 + j < CG));
        }
#else
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const int k = kt * BK + r0 + j;
            const unsigned dst = smem_u32(sb + (r0 + j) * B_LD + col0);
#if PAD_H == 0 && PAD_W == 0
            const int offset = __ldg(reinterpret_cast<const int*>(table) + 4 * k);
#pragma unroll
            for (int i = 0; i < NCOLS; ++i)
                cp_async4(dst + i * (COLT * 4), x + (off[i] + offset),
                          in_image(i, 0, 0) && k < CG * KK);
#else
            const int4 e = __ldg(table + k);
#pragma unroll
            for (int i = 0; i < NCOLS; ++i)
                cp_async4(dst + i * (COLT * 4), x + (off[i] + e.x), in_image(i, e.y, e.z));
#endif
        }
#endif
    }
#endif
};
"""

START = r"""
    NchwGather gather(tid);
    gather.start(unit, npix);
"""

# After the A copy's `load_a` (mainloop.LOAD_A): what the pipeline calls, for 2-byte elements
# (B through registers) or 4-byte ones.
LOAD_TILE = r"""
#if HALF
    auto gather_b = [&](int kt) { gather.fetch(x, table, kt); };
    auto store_b = [&](int stage) { gather.store(smem + stage * STAGE_WORDS + A_WORDS); };
#else
    auto load_tile = [&](int stage, int kt) {
        load_a(stage, kt);
        gather.load(smem + stage * STAGE_WORDS + A_WORDS, x, table, kt);
    };
#endif
"""


def gather_table(shape: ConvShape, t: Tiling) -> np.ndarray:
    """The "table" gather's int4 per k: (c*H*W + p*W + q, p, q, 0), (p, q) the tap's offset in
    the window (its row and column times the dilation); k past the reduction gets an offset of
    0 and p = INVALID_TAP, so its bounds test fails and it gathers a zero."""
    kk = shape.taps
    k = np.arange(k_tiles(shape, t) * t.bk)
    c, tap = k // kk, k % kk
    p, q = tap // shape.Kw * shape.dilation, tap % shape.Kw * shape.dilation
    valid = k < shape.Cg * kk
    table = np.zeros((k.size, 4), dtype=np.int32)
    table[:, 0] = np.where(valid, c * shape.H * shape.W + p * shape.W + q, 0)
    table[:, 1] = np.where(valid, p, INVALID_TAP)
    table[:, 2] = np.where(valid, q, 0)
    return table
