"""The im2col B operand, gathered on the fly from the NCHW input: each thread's pixel columns
(COLUMN_ORIGINS), then a K-tile's elements (GATHER_B): with GATHER_TAP the K order is
(channel chunk, tap, channel) and a column's elements of one K-tile share one tap; otherwise K
runs in the weights' (c, p, q) order through `gather_table`'s offsets. 4-byte elements go
straight to shared memory by cp.async; fp16/bf16 pass through registers."""

import numpy as np

from ...shapes import ConvShape
from .tiling import INVALID_TAP, Tiling, k_tiles

COLUMN_ORIGINS = r"""
    // This thread's pixel columns: where their receptive field starts. A column past the last
    // pixel gets a row origin that fails every bounds test, so it gathers zeros.
    const int col0 = tid % COLT;
    const int r0 = (tid / COLT) * RPT;
    long long off[NCOLS];
    int ih0[NCOLS], iw0[NCOLS];
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
"""

GATHER_B = r"""
#if HALF
    elem_t bv[NCOLS][RPT];  // the next K-tile's B elements, in flight while this one computes
    auto gather_b = [&](int kt) {
#if GATHER_TAP
        const int cc = kt / KK, tap = kt - cc * KK, row = tap / KW;
        const int p = row * DIL, q = (tap - row * KW) * DIL;
        const int c0 = cc * BK + r0;
#pragma unroll
        for (int i = 0; i < NCOLS; ++i) {
            const bool ok = TAP_OK(i, p, q);
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
                const bool ok = TAP_OK(i, 0, 0) && k < CG * KK;
                bv[i][j] = ok ? __ldg(x + (off[i] + offset)) : (elem_t)0;
            }
#else
            const int4 e = __ldg(table + k);
#pragma unroll
            for (int i = 0; i < NCOLS; ++i) {
                const bool ok = TAP_OK(i, e.y, e.z);
                bv[i][j] = ok ? __ldg(x + (off[i] + e.x)) : (elem_t)0;
            }
#endif
        }
#endif
    };
    auto store_b = [&](int stage) {
        elem_t* sb = reinterpret_cast<elem_t*>(smem + stage * STAGE_WORDS + A_WORDS);
#pragma unroll
        for (int i = 0; i < NCOLS; ++i)
#pragma unroll
            for (int j = 0; j < RPT; ++j) sb[(r0 + j) * B_LD + col0 + i * COLT] = bv[i][j];
    };
#else
    auto load_tile = [&](int stage, int kt) {
        load_a(stage, kt);
        float* sb = smem + stage * STAGE_WORDS + A_WORDS;
#if GATHER_TAP
        const int cc = kt / KK, tap = kt - cc * KK, row = tap / KW;
        const int p = row * DIL, q = (tap - row * KW) * DIL;
        const int c0 = cc * BK + r0;
#pragma unroll
        for (int i = 0; i < NCOLS; ++i) {
            const bool ok = TAP_OK(i, p, q);
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
                          TAP_OK(i, 0, 0) && k < CG * KK);
#else
            const int4 e = __ldg(table + k);
#pragma unroll
            for (int i = 0; i < NCOLS; ++i)
                cp_async4(dst + i * (COLT * 4), x + (off[i] + e.x), TAP_OK(i, e.y, e.z));
#endif
        }
#endif
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
