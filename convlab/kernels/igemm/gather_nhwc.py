"""The im2col B operand gathered from a channels-last (NHWC) input (NhwcGather, for the grid
and persistent schedules alike): a pixel's channels are contiguous, so a B row (one pixel, BK
reduction elements of one tap) is VEC-element cp.async copies, 16 bytes where the channel count
allows, straight into a [n][k] shared tile. With GATHER_TAP a K-tile is BK channels of one tap
(K order: channel chunk, tap, channel: the weights' order of the NCHW "tap" gather); otherwise
K runs (tap, channel) through `gather_table`'s per-vector offsets, for layers with fewer
channels than a K-tile."""

import numpy as np

from ...shapes import ConvShape
from .tiling import INVALID_TAP, Tiling, k_tiles

# The gather as a type: a thread's share of every B tile, the rows of the tile's unit it copies
# (`start`, once a unit) and the K-tile's copies of them (`load`). Its Rows rows (BN_ROWS) are
# row0, row0 + ROW_STEP, ...: under SWIZZLE, ROW_STEP % 8 == 0 keeps their swizzle phase. A
# template, so a build whose schedule has no such gather (the halo's, whose N may be below
# ROW_STEP) never sizes its arrays.
NHWC_GATHER = r"""
template <int Rows>
struct NhwcGather {
    enum : bool { copy_engine = false };  // the threads copy (cp.async)
    const int kc, row0;  // this thread copies vector kc of rows row0, row0 + ROW_STEP, ... (Rows)
    long long off[Rows];
    int ih0[Rows], iw0[Rows];

    // tid: the thread's number among the LOADERS threads that gather.
    __device__ __forceinline__ explicit NhwcGather(int tid)
        : kc(tid % KCHUNKS), row0(tid / KCHUNKS) {}
    // ... and its rows of the unit's tile (`start`): the grid schedule's one unit.
    __device__ __forceinline__ NhwcGather(int tid, const TileUnit& unit, int npix)
        : NhwcGather(tid) { start(unit, npix); }

    // Where each of this thread's rows of the unit's tile has its pixel window start, and its
    // offset at tap (0, 0) (plus, in tap order, its vector's channels: the table's offsets
    // hold those). A row past the last pixel gets a row origin that fails every bounds test,
    // so it gathers zeros.
    __device__ __forceinline__ void start(const TileUnit& unit, int npix)
    {
#pragma unroll
        for (int i = 0; i < Rows; ++i) {
            const int n = unit.ntile * BN + row0 + i * ROW_STEP;
            if (n < npix) {
                const int b = n / HWO, r = n - b * HWO;
                const int ho = r / WO, wo = r - ho * WO;
                ih0[i] = ho * STRIDE - PAD_H;
                iw0[i] = wo * STRIDE - PAD_W;
                off[i] = (((long long)b * H + ih0[i]) * W + iw0[i]) * C + unit.group * CG
                         + (GATHER_TAP ? kc * VEC : 0);
            } else {
                ih0[i] = -(1 << 29);
                iw0[i] = 0;
                off[i] = 0;
            }
        }
    }

    // K-tile kt of this thread's rows, by cp.async into the B tile of stage `stage` of `smem`.
    // A row reads zeros outside the image at the tap (p rows and q columns into the window:
    // its index times DIL). Without padding every tap of a real pixel lies inside the image
    // (ho*S + p <= H-1 by the definition of HO), so only rows past the last pixel (ih0 < 0)
    // and, for the table, k past the reduction gather zeros. The test is written out here, not
    // called: as a function returning bool it took the grid schedule's 128x256 fp16 tile from
    // 200 to 206 registers (ptxas), and AlexNet conv2 1.08x the time (H200, 2026-11-29).
    __device__ __forceinline__ void load(float* smem, int stage,
                                         const elem_t* __restrict__ x,
                                         const int4* __restrict__ table, int kt) const
    {
        const unsigned sb =
            smem_u32(smem + stage * STAGE_WORDS + A_WORDS) + B_VEC_OFFSET(row0, kc);
        int shift, p, q;
        bool used;
        if constexpr (GATHER_TAP) {
            const int cc = kt / KK, tap = kt - cc * KK, row = tap / KW;
            p = row * DIL;
            q = (tap - row * KW) * DIL;
            shift = (p * W + q) * C + cc * BK;
            used = CG % BK == 0 || cc * BK + kc * VEC < CG;
        } else {
            // {offset (p*W + q)*C + c, p, q, whether k lies inside the reduction} per vector, p
            // and q the tap's rows and columns into the window (its index times DIL)
            const int4 e = __ldg(table + kt * KCHUNKS + kc);
            shift = e.x;
            p = e.y;
            q = e.z;
            used = e.w != 0;
        }
#pragma unroll
        for (int i = 0; i < Rows; ++i)
            cp_async_vec<VEC * ELEM_BYTES>(sb + i * (ROW_STEP * B_LD * ELEM_BYTES),
                                           x + (off[i] + shift),
                                           used && (PAD_H == 0 && PAD_W == 0
                                                        ? ih0[i] >= 0
                                                        : (unsigned)(ih0[i] + p) < (unsigned)H
                                                              && (unsigned)(iw0[i] + q)
                                                                     < (unsigned)W));
    }
};
"""

# The grid kernels' gather: every thread gathers, for the block's one unit.
START = r"""
    const NhwcGather<BN_ROWS> gather(tid, unit, npix);
"""

# After the A copy's `load_a` (mainloop.LOAD_A): a K-tile's operands into a stage, for the
# pipelines.
LOAD_TILE = r"""
    auto load_tile = [&](int stage, int kt) {
        load_a(stage, kt);
        gather.load(smem, stage, x, table, kt);
    };
"""


def gather_table(shape: ConvShape, t: Tiling, vec: int) -> np.ndarray:
    """The "table" gather's int4 per VEC-element vector of k = tap*Cg + c: ((p*W + q)*C + c,
    p, q, 1), (p, q) the tap's offset in the window (its row and column times the dilation);
    vectors past the reduction get (0, INVALID_TAP, 0, 0) and gather zeros."""
    k = np.arange(0, k_tiles(shape, t) * t.bk, vec)
    tap, c = k // shape.Cg, k % shape.Cg
    p, q = tap // shape.Kw * shape.dilation, tap % shape.Kw * shape.dilation
    valid = k < shape.Cg * shape.taps
    table = np.zeros((k.size, 4), dtype=np.int32)
    table[:, 0] = np.where(valid, (p * shape.W + q) * shape.C + c, 0)
    table[:, 1] = np.where(valid, p, INVALID_TAP)
    table[:, 2] = np.where(valid, q, 0)
    table[:, 3] = valid
    return table
