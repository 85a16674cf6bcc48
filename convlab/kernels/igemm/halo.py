"""The wgmma kernel's halo schedule (Tiling.schedule "halo"): persistent and warp-specialised as
igemm.persistent, but B is not gathered per tap. A tile is `rows` whole output rows of one image
(stride 1); the loaders copy the input patch those rows read (rows + K - 1 input rows, padding
as zeros) once per channel chunk, and each of the K*K taps reads B straight out of that patch at
a shift. An input pixel then crosses L2 once per tile instead of once per tap (9x fewer B bytes
on a 3x3 layer), where ncu had the persistent schedule on the ResNet 3x3 layer waiting on its
gather (long scoreboard, L2 at 66%) with the tensor pipe 39% active.

The shift works on a padded output grid: output q = i*PW + j (PW = W + 2*PAD, the patch's
width) reads patch pixel q + p*PW + s at tap (p, s), so one tap's B rows are a contiguous run
of patch pixels. The K - 1 columns past each row's last output are computed and dropped
(2 of 58 on the ResNet layer). The patch is stored as B is elsewhere, a pixel's 128 bytes of
channels a row with 16-byte chunk c at c ^ (row % 8), the patch starting on 1 KB; a tap's
descriptor starts at its first pixel, mid-atom. The H100 applies the 128-byte swizzle to the
shared address itself, so that start reads right with the descriptor's base offset left at 0
(set to (address >> 7) & 7, the outputs were wrong: H100, 2026-11-25), and 128-byte-swizzled
B ran the ResNet layer 1.2x faster than B stored unswizzled as 8-row x 16-byte core matrices
(which any 16-byte shift could start), in fp16 and tf32 alike.

A (the filters, host-packed and swizzled as in the other schedules) comes by the copy engine
into a ring of `stages` K-tile buffers; where the ring holds every K-tile of the layer, a block
keeps its tiles' filters resident and walks a contiguous run of tiles sharing them (A is then
copied once per block or per m-tile change instead of once per tile)."""

from ...shapes import ConvShape
from ..base import blocks
from . import mainloop
from .tiling import INT32_MAX, Tiling, element_bytes

ROW_BYTES = 128
# Two patch buffers: a third cost blocks per SM and was slower on the ResNet layer's tilings
# that ran two blocks (0.0498 against 0.0461 ms, H100, 2026-11-25).
PATCH_STAGES = 2

# PATCHERS: loader warp 0 brings A (one lane issues the bulk copies), warps 1-3 copy patches.
KERNEL = r"""
// wpack: A tiles as the swizzled shared memory holds them, [G][MTILES][KTILES][BM*BK] (a
// group's last m-tile trimmed: FilterTiles) in the tap gather's K order (channel chunk, tap,
// channel); table, ws and counters are unused. A tile is Rows output rows of one image; its
// channel chunks' patches take turns in PatchStages buffers.
template <int Rows, int PatchStages>
struct HaloKernel {
    enum : int { threads = THREADS + LOADERS, min_blocks = MIN_BLOCKS };
    // The 128-byte swizzle follows the shared address (the patch starts on 1 KB): a tap's B
    // starts at any pixel, mid-atom, with the descriptor's base offset 0.
    enum : int {
        PW = W + 2 * PAD_W,
        PROWS = (BN + (KH - 1) * (PW + 1) + 7) / 8 * 8,
        PATCH_BYTES = PROWS * 128,
        PATCHERS = 96,
        A_BYTES = A_WORDS * 4,
    };
    enum : bool { A_RESIDENT = STAGES == KTILES };
    using Walk = HaloWalk<MTILES, KTILES, G, (HO + Rows - 1) / Rows, Rows>;

    static __device__ __forceinline__ void run(""" + mainloop.RUN_PARAMETERS + r""");
};

template <int Rows, int PatchStages>
__device__ __forceinline__ void HaloKernel<Rows, PatchStages>::run(""" + (
    mainloop.RUN_PARAMETERS + r""")
{""" + mainloop.WARP_SPECIALISED_SMEM + r"""
    // The A ring, two patches, then the barriers: A full (the bulk copy landed) and empty
    // (every MMA thread is done with it) per A buffer, patch full (each patch copier's copies
    // landed) and empty per patch.
    const unsigned a0 = smem_u32(smem);
    const unsigned patch0 = a0 + STAGES * A_BYTES;
    const unsigned afull0 = patch0 + PatchStages * PATCH_BYTES;
    const unsigned aempty0 = afull0 + 8 * STAGES;
    const unsigned pfull0 = aempty0 + 8 * STAGES;
    const unsigned pempty0 = pfull0 + 8 * PatchStages;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3;
    const int tile_warp = warp;  // the warp's 16 rows of the tile
    // Tiles in (group, m-tile, image, row block) order, a contiguous run of them a block
    // (igemm.tile_walks).
    const Walk walk(batch);
    if (tid == 0) {
#pragma unroll 1
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(afull0 + 8 * s, 1);
            mbar_init(aempty0 + 8 * s, THREADS);
        }
        for (int s = 0; s < PatchStages; ++s) {
            mbar_init(pfull0 + 8 * s, PATCHERS);
            mbar_init(pempty0 + 8 * s, THREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (warp >= NWARPS) {
        if constexpr (PRODUCER_REGS > 0) setmaxnreg_dec<PRODUCER_REGS>();
        if (warp == NWARPS) {
            // A: K-tile j to buffer j % STAGES once the MMA threads released its last use;
            // resident filters are copied only when the tile's (group, m-tile) changes.
            if (lane == 0) {
                int j = 0, held = -1;
                for (int t = walk.first; t < walk.last; ++t) {
                    const int gm = walk.filters(t);
                    if (A_RESIDENT && gm == held) continue;
                    held = gm;
                    const FilterTiles wtiles(wpack, gm);
                    for (int kt = 0; kt < KTILES; ++kt, ++j) {
                        const int stage = j % STAGES;
                        const unsigned bar = afull0 + 8 * stage;
                        mbar_wait(aempty0 + 8 * stage, ((j / STAGES) & 1) ^ 1);
                        mbar_arrive_expect(bar, A_BYTES);
                        bulk_copy(a0 + stage * A_BYTES, wtiles.tile(kt), A_BYTES, bar);
                    }
                }
            }
        } else {
            // Patch u (a tile's channel chunk) goes to buffer u % PatchStages once the MMA
            // threads released it; it is published when its copies landed, before the next one
            // starts, so it lands while the MMA threads work through the chunk before it.
            // Thread ptid copies 16-byte chunk kc of patch pixels row0, row0 + 12, ... (to
            // chunk kc ^ (pixel % 8)): a warp covers four whole pixels, 512 contiguous bytes
            // read and written.
            const int ptid = tid - THREADS - 32;
            const int kc = ptid & 7, row0 = ptid >> 3;
            int u = 0;
            auto publish = [&](int p) {
                cp_async_wait<0>();
                fence_proxy_async();
                mbar_arrive(pfull0 + 8 * (p % PatchStages));
            };
            for (int t = walk.first; t < walk.last; ++t) {
                const TileUnit unit = walk.unit(t);
                const elem_t* img = x + (long long)unit.image * H * W * C + unit.group * CG
                                    + kc * VEC;
                for (int cc = 0; cc < CCHUNKS; ++cc, ++u) {
                    if (u > 0) publish(u - 1);
                    const int ps = u % PatchStages;
                    mbar_wait(pempty0 + 8 * ps, ((u / PatchStages) & 1) ^ 1);
                    const unsigned dst = patch0 + ps * PATCH_BYTES;
#pragma unroll 4
                    for (int r = row0; r < PROWS; r += PATCHERS / 8) {
                        const int ih = unit.h0 - PAD_H + r / PW, iw = r % PW - PAD_W;
                        cp_async_vec<VEC * ELEM_BYTES>(
                            dst + r * 128 + ((kc ^ (r & 7)) << 4),
                            img + ((long long)ih * W + iw) * C + cc * BK,
                            (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W);
                    }
                    cp_async_commit();
                }
            }
            if (u > 0) publish(u - 1);
        }
    } else {
        if constexpr (CONSUMER_REGS > 0) setmaxnreg_inc<CONSUMER_REGS>();
        float acc[MF][NF][4];
        // Warpgroup w multiplies rows 64w.. of A; tap (p, s) reads the patch p*PW + s pixels
        // in (mid-atom: the swizzle follows the address, see above). A K-tile's A buffer (and
        // a chunk's patch, after its last tap) is released once the wgmmas reading it
        // retired: one group stays in flight, so K-tile j's release follows the issue of j + 1.
        const unsigned wg_rows = (warp / 4) * 64 * 128;
        int j = 0, u = 0, round = 0, held = -1;
        for (int t = walk.first; t < walk.last; ++t) {
            const int gm = walk.filters(t);
            const TileUnit unit = walk.unit(t);
            const bool fresh = !A_RESIDENT || gm != held;
            const bool keep = A_RESIDENT && t + 1 < walk.last && walk.filters(t + 1) == gm;
            held = gm;
#pragma unroll
            for (int f = 0; f < NF; ++f)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[0][f][e] = 0.0f;
            fence_operands(acc);
            for (int cc = 0; cc < CCHUNKS; ++cc, ++u) {
                mbar_wait(pfull0 + 8 * (u % PatchStages), (u / PatchStages) & 1);
                const unsigned sp = patch0 + (u % PatchStages) * PATCH_BYTES;
                for (int tap = 0; tap < KK; ++tap, ++j) {
                    const int kt = cc * KK + tap;
                    const int stage = A_RESIDENT ? kt : j % STAGES;
                    if (fresh)
                        mbar_wait(afull0 + 8 * stage, A_RESIDENT ? round & 1 : (j / STAGES) & 1);
                    const int p = tap / KW, s = tap - p * KW;
                    const unsigned sa = a0 + stage * A_BYTES + wg_rows;
                    const unsigned sb = sp + (p * PW + s) * 128;
                    mainloop_step(sa, sb, acc, false);
                    wgmma_wait<1>();
                    if (!A_RESIDENT && kt > 0) mbar_arrive(aempty0 + 8 * ((j - 1) % STAGES));
                    if (tap == 0 && cc > 0) mbar_arrive(pempty0 + 8 * ((u - 1) % PatchStages));
                }
            }
            wgmma_wait<0>();
            if (!A_RESIDENT) mbar_arrive(aempty0 + 8 * ((j - 1) % STAGES));
            mbar_arrive(pempty0 + 8 * ((u - 1) % PatchStages));
            if (fresh) ++round;
            if (A_RESIDENT && !keep)
                for (int kt = 0; kt < KTILES; ++kt) mbar_arrive(aempty0 + 8 * kt);
            fence_operands(acc);
            // GEMM column q is grid position (unit.h0 + q / PW, q % PW), an output where that is one.
            out_t* const ytile = y + ((long long)unit.image * HO + unit.h0) * WO * M
                                 + unit.group * MG + unit.mtile * BM;
            auto pixel = [&](int q, unsigned& at) {
                const int i = q / PW, col = q - i * PW;
                at = (i * WO + col) * M;
                return col < WO && i < Rows && unit.h0 + i < HO;
            };
            prefetch_kept_tile(unit, ytile, pixel, tile_warp, lane, y, kept);
            // no 16-byte path here (VECTOR_STORE is 0 under HALO), so no scratch
            store_registers_nhwc(acc, unit, pixel, ytile, ytile + 16 * tile_warp + g8, tile_warp,
                                 warp, lane, g8, t4, 0u, y, bias, kept);
        }
    }
}
""")


def patch_width(shape: ConvShape) -> int:
    return shape.W + 2 * shape.pad


def halo_bn(shape: ConvShape, rows: int) -> int:
    """The GEMM's N for `rows` output rows: the padded grid's positions from the first output
    to the last, rounded up to wgmma's step of 8."""
    return blocks(rows * patch_width(shape) - (shape.K - 1), 8) * 8


def patch_rows(shape: ConvShape, bn: int) -> int:
    """Patch pixels a tile's buffer holds: every pixel the last tap's B rows reach, in 8s."""
    return blocks(bn + (shape.K - 1) * (patch_width(shape) + 1), 8) * 8


def patch_bytes(shape: ConvShape, t: Tiling) -> int:
    return patch_rows(shape, t.bn) * ROW_BYTES


def smem_bytes(shape: ConvShape, t: Tiling, align: int) -> int:
    """The A ring, the two patches and the barriers, plus the alignment slack."""
    a_ring = t.stages * t.bm * ROW_BYTES
    return (a_ring + PATCH_STAGES * patch_bytes(shape, t) + 8 * (2 * t.stages + 2 * PATCH_STAGES)
            + align)


def problem(shape: ConvShape, t: Tiling, maths: str, k_tiles: int) -> str:
    """Why the halo tiling `t` cannot run the (channel-padded) layer, or ""."""
    if shape.stride != 1:
        return "the halo schedule needs stride 1 (a tap's B rows are a shift of the patch)"
    if not shape.is_square:
        return ("the halo schedule runs square, undilated filters padded alike on every side "
                f"(not {shape.kernel_text()}, padding {shape.padding_text()}, dilation "
                f"{shape.dilation})")
    if shape.Cg * element_bytes(maths) % ROW_BYTES:
        return (f"the halo schedule needs whole 128-byte channel chunks: {shape.Cg} channels "
                f"of {maths} per group")
    if t.rows > shape.Ho:
        return f"rows {t.rows} exceed the layer's {shape.Ho} output rows"
    if t.bn != halo_bn(shape, t.rows):
        return f"bn must be {halo_bn(shape, t.rows)} for {t.rows} rows of this layer"
    if t.stages > k_tiles:
        return f"stages {t.stages} exceed the layer's {k_tiles} K-tiles"
    if t.stages == 1 and k_tiles > 1:
        # the MMA threads free K-tile j's buffer after issuing j + 1, which needs that buffer
        return "one A buffer holds only a one-K-tile layer's filters: stages must be at least 2"
    if shape.groups * blocks(shape.Mg, t.bm) * shape.B * blocks(shape.Ho, t.rows) > INT32_MAX:
        return "the layer has more tiles than the kernel's 32-bit tile index holds"
    return ""


def row_options(shape: ConvShape) -> list[int]:
    """Rows a tile may take: each count whose N fits one wgmma (up to 256); none for a filter
    the schedule does not run (problem)."""
    if not shape.is_square:
        return []
    return [r for r in range(1, shape.Ho + 1) if halo_bn(shape, r) <= 256]
