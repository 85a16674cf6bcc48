"""The Hopper mainloop: warpgroup MMAs (`wgmma.mma_async`, sm_90a) reading both operands from
128-byte-swizzled shared memory through descriptors, one group of them in flight while the next
K-tile's copies land. Beside it the host side of that layout: the filters packed as the swizzled
shared-memory image of each A tile, the tiling rules and the tilings worth trying.

The accumulators of a warpgroup's m64nN product sit in each warp as those of a 16 x N mma.sync
warp tile (warp w of the group holds rows 16w..16w+15): with WARPS_M = NWARPS and WARPS_N = 1
the mma.sync pieces' epilogue and split-K reduce take them unchanged. Under the pingpong
schedule each warpgroup holds a 64-row tile of its own (the pieces read the warp's rows as
`tile_warp`).
"""

import itertools
import math
from dataclasses import replace

import numpy as np

from ...gpu import tensormap
from ...gpu.hardware import H100
from ...gpu.hopper import WGMMA_NS, WGMMA_PTX
from ...shapes import NHWC, ConvShape
from . import cost, halo
from .tiling import (HALF_MATHS, MAX_SMEM, MAX_WGMMA_ROWS, Tiling, a_parts, channel_vector,
                     element_bytes, k_tiles, output_tiles, shape_problem, vector_rows)

ROW_BYTES = 128  # one swizzle atom row, BK elements: a K-tile
SWIZZLE_ALIGN = 1024  # an atom (8 rows) is 1 KB: tiles start on 1 KB, the host asks for 1 KB more
# Blocks a cluster of the persistent schedule may hold (Tiling.cluster): two, on neighbouring
# m-tiles, share each B copy (igemm.persistent).
CLUSTERS = (1, 2)
INSTRUCTIONS = WGMMA_PTX + r"""
// This build's products: the tile's N (WGMMA_N; the halo schedule's tail, WGMMA_TAIL, into the
// last fragments) in MODE's element type, and 3xTF32's cross terms in BF16 (CROSS_BF16). Each
// is a template so that a build which never calls it never instantiates its product.
using MmaElement = ModeElement<MODE>::type;

template <int N = WGMMA_N>
__device__ __forceinline__ void wgmma_tile(float (&d)[MF][NF][4], unsigned long long da,
                                           unsigned long long db, int scale_d = 1)
{
    WgmmaOp<N, MmaElement>::template mma<0>(d, da, db, scale_d);
}

template <int Tail = WGMMA_TAIL>
__device__ __forceinline__ void wgmma_tail(float (&d)[MF][NF][4], unsigned long long da,
                                           unsigned long long db, int scale_d = 1)
{
    WgmmaOp<Tail, MmaElement>::template mma<NF - Tail / 8>(d, da, db, scale_d);
}

template <int N = WGMMA_N>
__device__ __forceinline__ void wgmma_cross(float (&d)[MF][NF][4], unsigned long long da,
                                            unsigned long long db, int scale_d = 1)
{
    WgmmaOp<N, Bf16>::template mma<0>(d, da, db, scale_d);
}

// A_SPLIT_ON_CHIP (FILTERS_ONCE, the warp-specialised schedules' 3xTF32): the stage's A tile
// is the float32 filters as packed, once; each MMA thread splits its own A fragments of a
// K-tile in registers (wgmma's register-A form, an mma.sync m16n8k(8|16) A fragment of its
// warp's 16 rows) and the products read only B from shared memory. On an H200 (2026-11-29) the
// shipped persistent fp32 tilings ran 1.06-1.14x (3xTF32) and 1.16-1.19x (BF16 cross) slower
// so; splitting in shared memory instead (each warpgroup its rows: a load and two stores a
// vector, a fence and a barrier) 1.23-1.47x, and splitting the next K-tile's fragments while
// this one's products ran (two sets of registers) 1.10-1.29x. The split is the host's
// (packing.split_tf32, cross_bf16): the big part rounded to TF32 (cvt.rna is round_tf32), the
// residual rounded to TF32 or, CrossBf16, both to BF16 (cvt.rn, as to_bf16_bits), so the
// products take the operands the host's packs held, in the same order. The A tile at `sa` is
// the warpgroup's 64 rows: row r's 16-byte chunk c lies at chunk c ^ (r % 8), and a thread's
// rows g and g + 8 of its warp's 16 both have phase g. The first product of a partial sum
// (`fresh`) starts it.
__device__ __forceinline__ float a_element(unsigned row, int g, int k)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n"
                 : "=f"(v) : "r"(row + ((((k >> 2) ^ g) << 4) | ((k & 3) << 2))));
    return v;
}

__device__ __forceinline__ unsigned bf16_pair(float lo, float hi)
{
    unsigned r;  // cvt.rn.bf16x2 puts its first operand in the high half: the later element
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <bool CrossBf16, int MFrags, int NFrags>
__device__ __forceinline__ void split_a_products(unsigned sa, unsigned sb,
                                                 float (&d)[MFrags][NFrags][4], bool fresh)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const unsigned row = sa + (16 * ((threadIdx.x >> 5) & 3) + g) * 128;  // row g + 8: + 1024
    unsigned big[KSTEPS][4], other[KSTEPS][4];  // other: the small part, or the BF16 cross row
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // (row g, k t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
            const float a = a_element(row + (i & 1) * 1024, g, 8 * s + t + (i >> 1) * 4);
            big[s][i] = to_tf32(a);
            if constexpr (!CrossBf16) other[s][i] = to_tf32(a - __uint_as_float(big[s][i]));
        }
        if constexpr (CrossBf16) {
            // k16 step s of the row [big | small] in BF16: elements 16s + 2t, + 1 (registers 0
            // and 1: rows g and g + 8) and 16s + 2t + 8, + 9 (registers 2 and 3), the big part
            // of columns 16s.. for s < 2, the residual of columns 16(s - 2).. after
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int k = 16 * (s & 1) + 2 * t + (i >> 1) * 8;
                const unsigned r = row + (i & 1) * 1024;
                const float a0 = a_element(r, g, k), a1 = a_element(r, g, k + 1);
                const float b0 = __uint_as_float(to_tf32(a0)), b1 = __uint_as_float(to_tf32(a1));
                other[s][i] = s < 2 ? bf16_pair(b0, b1) : bf16_pair(a0 - b0, a1 - b1);
            }
        }
    }
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
        if constexpr (CrossBf16) {
            WgmmaRegA<WGMMA_N, Bf16>::template mma<0>(
                d, other[s], swizzle128_desc(sb + B_WORDS * 4 + s * 32), s > 0 || !fresh);
        } else {
            WgmmaRegA<WGMMA_N, Tf32>::template mma<0>(d, other[s], swizzle128_desc(sb + s * 32),
                                                     s > 0 || !fresh);
            WgmmaRegA<WGMMA_N, Tf32>::template mma<0>(
                d, big[s], swizzle128_desc(sb + B_WORDS * 4 + s * 32), 1);
        }
        WgmmaRegA<WGMMA_N, Tf32>::template mma<0>(d, big[s], swizzle128_desc(sb + s * 32), 1);
    }
    wgmma_commit();
}

// wgmma reads a TF32 operand by dropping each float's low 13 bits. 3xTF32: the filters are
// split on the host; B's big part is the vector as it landed (wgmma truncates it), and each
// thread writes the exact residual, rounded to TF32, to B's small tile once its copies land.
// One vector load and store per copy, as it was copied: a warp's lanes cover whole 128-byte
// rows. Rounding the big part in place as well cost a store per vector and its
// shared-memory bandwidth: 4-9% on every AlexNet layer and the ResNet one (H200,
// 2026-11-26). The truncated big part leaves a residual up to 2^-10 of the input (not 2^-11), so
// the small part's rounding and the dropped small x small product err by up to 2^-21 of
// each product instead of 2^-22: on same-sign data at n = 64 the error went from 0.11 to
// 0.14-0.17 of the fp32 bound (n = 4,608: 0.022 to 0.025-0.028).
// TF32 (MODE 0) reads B as it landed, truncated: that errs by at most 2^-10 of each input,
// 1.5 * 2^-10 * sum|x*w| in all with the host-rounded filters, under the tf32 bound of
// 8 * sqrt(n) * 2^-11 * sum|x*w| at every n and whatever the signs. Rounding in place cost
// a shared-memory load and store per vector before each K-tile's barrier (ncu, AlexNet conv3:
// short-scoreboard stalls 1.78 per issued instruction against 0.01 in fp16). In a network
// the tf32 conv before writes its output rounded to TF32 (OUT_TF32), which lands exact.
template <int Vec> struct FloatVec;
template <> struct FloatVec<4> { typedef float4 type; };
template <> struct FloatVec<2> { typedef float2 type; };

// The 3xTF32 split of this thread's vector kc of the stage's B tile, rows row0, row0 +
// ROW_STEP, ... (sb), in place. It takes the stage's index, not the B tile's address: written
// that way it built other machine code (8 fewer instructions on the grid schedule), never
// timed; this form builds what each schedule's own copy of it built. Vec is a parameter so
// that FloatVec is only instantiated where the split runs (VEC is 8 in 16-bit builds).
template <bool CrossBf16, int Vec = VEC>
__device__ __forceinline__ void split_b_tile(float* smem, int stage, int row0, int kc)
{
    float* sb = smem + stage * STAGE_WORDS + A_WORDS;
    typedef typename FloatVec<Vec>::type vec_t;
#pragma unroll
    for (int i = 0; i < BN_ROWS; ++i) {
        const int n = row0 + i * ROW_STEP;
        vec_t* p = reinterpret_cast<vec_t*>(sb + (B_VEC_OFFSET(n, kc)) / 4);
        vec_t v = *p;
        const float* f = reinterpret_cast<const float*>(&v);
        if constexpr (CrossBf16) {
            // B's second tile in BF16: a row holds the exact residuals, then the truncated
            // TF32 big parts (as wgmma reads the first tile), each rounded to nearest: 2 * Vec
            // bytes at element k of the row and as many at 32 + k.
            // cvt.rn.bf16x2 puts its first operand in the high half: the later element.
            unsigned small[Vec / 2], big[Vec / 2];
#pragma unroll
            for (int e = 0; e < Vec; e += 2) {
                const float b0 = __uint_as_float(__float_as_uint(f[e]) & 0xFFFFE000u);
                const float b1 = __uint_as_float(__float_as_uint(f[e + 1]) & 0xFFFFE000u);
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;"
                    : "=r"(small[e / 2]) : "f"(f[e + 1] - b1), "f"(f[e] - b0));
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(big[e / 2]) : "f"(b1), "f"(b0));
            }
            const unsigned row = smem_u32(sb + B_WORDS) + n * 128, phase = (n & 7) << 4;
            const unsigned lo = row + ((kc * Vec * 2) ^ phase);
            const unsigned hi = row + ((64 + kc * Vec * 2) ^ phase);
            if constexpr (Vec == 4) {
                asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n"
                             :: "r"(lo), "r"(small[0]), "r"(small[1]) : "memory");
                asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n"
                             :: "r"(hi), "r"(big[0]), "r"(big[1]) : "memory");
            } else {
                asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(lo), "r"(small[0]) : "memory");
                asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(hi), "r"(big[0]) : "memory");
            }
        } else {
            vec_t r;
            float* small = reinterpret_cast<float*>(&r);
#pragma unroll
            for (int e = 0; e < Vec; ++e)
                small[e] = __uint_as_float(
                    to_tf32(f[e] - __uint_as_float(__float_as_uint(f[e]) & 0xFFFFE000u)));
            p[B_WORDS / Vec] = r;
        }
    }
}
"""

# The mainloop's step, one K-tile's products: every schedule calls mainloop_step, declared before
# the kernels and defined after them, so a kernel file may define its own and take the rest of
# the family as it is (`convlab new NAME --from wgmma-fp16`; userkernel.library).
MAINLOOP_STEP_DECLARATION = r"""
// One K-tile's products into d: this warpgroup's 64 rows of the stage's A tile, at shared
// address sa, times the B tile at sb, issued as one group of wgmmas and committed. `fresh`: the
// first product starts a new sum (3xTF32's partial sums); the other maths add into d as it is.
template <int MFrags, int NFrags>
__device__ __forceinline__ void mainloop_step(unsigned sa, unsigned sb,
                                              float (&d)[MFrags][NFrags][4], bool fresh);
"""

MAINLOOP_STEP = r"""
// Both tiles lie in 128-byte rows, K-major, with the descriptors' 128-byte swizzle. Each k-step
// moves the descriptors 32 bytes along the rows (the swizzle acts on address bits 4-6 against
// 7-9, which a step inside the row leaves alone). Under the halo schedule N is WGMMA_N +
// WGMMA_TAIL: the tail's B rows follow the first WGMMA_N.
template <int MFrags, int NFrags>
__device__ __forceinline__ void mainloop_step(unsigned sa, unsigned sb,
                                              float (&d)[MFrags][NFrags][4], bool fresh)
{
    if constexpr (A_SPLIT_ON_CHIP) {
        split_a_products<CROSS_BF16>(sa, sb, d, fresh);
        return;
    }
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
        if constexpr (MODE == 1 && CROSS_BF16) {
            // The cross terms in BF16 (A's second tile [big | small] x B's [small | big], 64
            // elements a 128-byte row, so a k16 step is 32 bytes as a TF32 k8 step is), then
            // the big product in TF32, into the same partial sum. PTX promises the ordering of
            // accumulations without a fence only between wgmmas of one shape; ptxas chains
            // these k16 and k8 ones as it chains same-shape ones (no wait between them), and
            // the outputs match float64 on every layer tested (tests/test_gpu_pipelined.py).
            wgmma_cross(d, swizzle128_desc(sa + BM * 128 + s * 32),
                        swizzle128_desc(sb + B_WORDS * 4 + s * 32), s > 0 || !fresh);
        } else if constexpr (MODE == 1) {
            // 3xTF32: each operand is a big + small TF32 pair (A's small tile follows its big
            // one, as B's does); small x big and big x small first, the big product last. The
            // first product of a partial sum's first K-tile (`fresh`) starts it.
            wgmma_tile(d, swizzle128_desc(sa + BM * 128 + s * 32), swizzle128_desc(sb + s * 32),
                       s > 0 || !fresh);
            wgmma_tile(d, swizzle128_desc(sa + s * 32),
                       swizzle128_desc(sb + B_WORDS * 4 + s * 32));
        }
        if constexpr (WGMMA_N > 0)
            wgmma_tile(d, swizzle128_desc(sa + s * 32), swizzle128_desc(sb + s * 32));
        if constexpr (WGMMA_TAIL > 0)
            wgmma_tail(d, swizzle128_desc(sa + s * 32),
                       swizzle128_desc(sb + s * 32 + WGMMA_N * 128));
    }
    wgmma_commit();
}
"""

COMPUTE = r"""
    float acc[MF][NF][4];
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
    fence_operands(acc);

    // Warpgroup wg multiplies rows 64wg..64wg+63 of the A tile by the whole B tile (under
    // PINGPONG each multiplies a 64-row tile of its own).
    const unsigned wg_rows = PINGPONG ? 0 : (warp / 4) * 64 * 128;
    auto compute = [&](int stage, float (&d)[MF][NF][4], bool fresh = true) {
        mainloop_step(smem_u32(smem + stage * STAGE_WORDS) + wg_rows,
                      smem_u32(smem + stage * STAGE_WORDS + A_WORDS), d, fresh);
    };
"""


PIPELINE = r"""
    // STAGES-2 K-tiles of copies in flight and one group of wgmmas. At step it the barrier says
    // that tile it has landed (each thread waited for its copies and fenced them) and that every
    // warpgroup has retired tile it-2's wgmmas (wait_group 1 after issuing tile it-1), so tile
    // it-2's stage, (it + STAGES - 2) % STAGES, takes tile it + STAGES - 2. The unit's K range
    // is reckoned from the block's index, as in the mma.sync pipeline (mainloop.PIPELINE says
    // why): read from the unit, NVRTC built other split-K code here too.
    const int split = blockIdx.x % SPLIT_K;
    const int kbeg = (int)((long long)split * KTILES / SPLIT_K);
    const int nk = (int)((long long)(split + 1) * KTILES / SPLIT_K) - kbeg;
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < nk) load_tile(s, kbeg + s);
        cp_async_commit();
    }
    // 3xTF32: a span of PART_KTILES K-tiles' products goes to a fresh partial sum, added to the
    // running one with FP32 adds (round to nearest): the tensor cores' truncating accumulation
    // then spans those K-tiles, not the whole reduction (as in the mma.sync kernel). The add
    // waits for every wgmma to retire (wait_group 0), which this schedule's block-wide barrier
    // then exposes: once a span, not once a K-tile (H100, 2026-11-26: conv5 0.258 -> 0.234 ms
    // at 3 K-tiles). The host sizes the span to the reduction (part_ktiles). Two partial sums
    // taking turns, one added while the other's group ran, made ptxas serialize every wgmma
    // of the kernel (C7514: other instructions read accumulators while a group is in flight).
    float part[MF][NF][4];
    if constexpr (MODE == 1) {
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[0][j][e] = 0.0f;
        fence_operands(part);
    }
    for (int it = 0; it < nk; ++it) {
        cp_async_wait<STAGES - 3>();
        if constexpr (MODE == 1)
            split_b_tile<CROSS_BF16>(smem, it % STAGES, gather.row0, gather.kc);
        fence_proxy_async();
        __syncthreads();
        const int ahead = it + STAGES - 2;
        if (ahead < nk) load_tile(ahead % STAGES, kbeg + ahead);
        cp_async_commit();
        if constexpr (MODE == 1) {
            compute(it % STAGES, part, it % PART_KTILES == 0);
            if ((it + 1) % PART_KTILES == 0 || it + 1 == nk) {
                wgmma_wait<0>();
                fence_operands(part);
#pragma unroll
                for (int j = 0; j < NF; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[0][j][e] += part[0][j][e];
            } else {
                wgmma_wait<1>();
            }
        } else {
            compute(it % STAGES, acc);
            wgmma_wait<1>();
        }
    }
    wgmma_wait<0>();
    fence_operands(acc);
    cp_async_wait<0>();
    __syncthreads();  // every warpgroup is done with the stages before the C tile overwrites them
"""


# --- the host side ------------------------------------------------------------------------------

def swizzle_tiles(a: np.ndarray, t: Tiling) -> np.ndarray:
    """[G][MTILES*bm][KTILES*bk] elements -> [G][MTILES][KTILES][bm*bk]: each A tile as the
    kernel's shared memory holds it, rows of 128 bytes with 16-byte chunk c of row m at chunk
    c ^ (m % 8), so the kernel copies it as it is."""
    G, rows, cols = a.shape
    mt, kt = rows // t.bm, cols // t.bk
    per_chunk = 16 // a.itemsize
    v = a.reshape(G, mt, t.bm, kt, ROW_BYTES // 16, per_chunk).transpose(0, 1, 3, 2, 4, 5)
    m = np.arange(t.bm)[:, None]
    chunk = np.arange(ROW_BYTES // 16)[None, :]
    out = np.empty_like(v)
    out[:, :, :, m, chunk ^ (m % 8)] = v[:, :, :, m, chunk]
    return np.ascontiguousarray(out).reshape(G, mt, kt, t.bm * t.bk)


def part_ktiles(reduction: int, t: Tiling, ktiles: int) -> int:
    """K-tiles a 3xTF32 partial sum of the grid schedule spans (PART_KTILES): as many as keep
    its terms within SPAN_TERMS_PER_ROOT_N * sqrt(n), n the layer's reduction; at least one,
    at most the layer's. The tensor cores truncate as they accumulate, so on data whose
    products all have one sign a span errs all one way, by about 0.035-0.04 x its terms /
    sqrt(n) of the fp32 bound (2026-11-26, n = 288: 0.06 / 0.12 / 0.25 at 1 / 2 / 4 K-tiles).
    The persistent schedule keeps one K-tile: its MMA threads release a stage once its own
    wgmmas retire, and within a span they could only once the next K-tile's were issued,
    which holds each stage until the next one lands (H100, 2026-11-26: conv2 0.591 -> 0.695
    ms at 3 K-tiles, conv3 0.356 -> 0.409 at 4)."""
    terms = int(SPAN_TERMS_PER_ROOT_N * math.sqrt(reduction))
    return max(1, min(ktiles, terms // t.bk))


def k_elements(maths: str) -> int:
    """BK: one 128-byte swizzle row of the element type."""
    return ROW_BYTES // element_bytes(maths)


def tiling_problem(t: Tiling, maths: str) -> str:
    """Why a wgmma kernel cannot be compiled with `t`, or ""."""
    if t.gather not in ("tap", "table", "tma"):
        return f"gather must be 'tap', 'table' or 'tma', not {t.gather!r}"
    if t.schedule not in SCHEDULES:
        names = ", ".join(repr(name) for name in SCHEDULES)
        return f"schedule must be one of {names}, not {t.schedule!r}"
    schedule = schedule_of(t)
    if t.gather == "tma" and not schedule.copies_by_tma:
        return ("gather 'tma' (the copy engine's im2col) runs in the persistent and pingpong "
                "schedules only")
    if t.gather == "tma" and maths == "3xtf32":
        return "gather 'tma' runs fp16, bf16 and tf32 (3xTF32 splits B as its copies land)"
    if not schedule.splits_k and t.split_k != 1:
        return f"the {t.schedule} schedule has no split-K: split_k must be 1"
    if t.cluster not in CLUSTERS:
        return f"cluster must be one of {', '.join(map(str, CLUSTERS))}"
    if t.cluster > 1 and (t.schedule != "persistent" or t.gather != "tma" or t.split_k != 1):
        return ("a cluster of blocks shares the copy engine's B copy: schedule 'persistent', "
                "gather 'tma', split_k 1")
    if t.warps_n != 1 or t.warps_m not in (4, 8):
        return "one or two warpgroups stacked along M: warps_m 4 or 8, warps_n 1"
    if t.bm != schedule.tile_rows(t):
        return f"bm must be {schedule.tile_rows(t)} in the {t.schedule} schedule"
    if t.bk != k_elements(maths):
        return f"bk must be {k_elements(maths)} (one 128-byte swizzle row of {maths})"
    return schedule.tiling_problem(t, maths)


def layer_problem(shape: ConvShape, t: Tiling, maths: str) -> str:
    """Why `t` cannot run the (channel-padded) layer, or "" (Schedule.layer_problem)."""
    return schedule_of(t).layer_problem(shape, t, maths)


# Shared memory a warp of the persistent schedule's 16-byte store turns its 16 channels around
# in (igemm.epilogue): 16 output columns of fp16, or 8 of float32.
STORE_SCRATCH = 512
# The maths whose register store has a 16-byte path (persistent's VECTOR_STORE), and so
# STORE_SCRATCH bytes a warp: fp16 output, and any maths' float32 output of an add-relu
# epilogue but 3xTF32's, whose two accumulator sets leave no registers for the kept read-ahead.
# The scratch is counted for every persistent tiling of these maths (the count does not know
# the epilogue); it changed no shipped tiling's blocks per SM or register split, nor the own
# choice of any of the layer suite's 440 tf32 and bf16 cells (checked on the CPU, 2026-11-28).
VECTOR_STORE_MATHS = ("tf32", "fp16", "bf16")
# A 3xTF32 partial sum's terms, at most, per sqrt(n): modelled same-sign error 0.2 of the bound
# (tests/test_gpu_pipelined.py holds it under 0.3).
SPAN_TERMS_PER_ROOT_N = 5
# 3xTF32 keeps a partial sum beside the running one: 2 * 128/2 = 128 registers at bn 128.
MAX_BN = {"3xtf32": 128}
# Registers a thread of the persistent schedule needs beside a wgmma's accumulators: compiling
# every persistent tiling of the ResNet layer and AlexNet's at two blocks per SM (NVRTC 12.9,
# 2026-11-25), those with accumulators + 24 above the cap failed (C7602 at the wgmma: 64x224 at
# 128 registers, 128x128 at 80) and all the others built.
PERSISTENT_OVERHEAD = 24
# The halo schedule's MMA threads beside their accumulators, and its loaders: compiling the
# halo tilings of the ResNet layer and AlexNet's conv3 (NVRTC 12.9), 72 left 64x120 (fp16)
# and 64x104 (tf32) spilling at two blocks per SM, and loaders held to 40 registers spilled.
HALO_OVERHEAD = 80
HALO_LOADER_REGISTERS = 56
# The "tma" gather's loaders: the persistent loop's counters and coordinates, no row origins.
TMA_LOADER_REGISTERS = 40
# Warpgroups an SM needs resident to issue at the wgmma peak: three, as gpu/peaks.py measures
# the peak. The sweeps in results/h100/wgmma-20261125 say that one warpgroup issues well below
# it (the model without this term ordered 60% of their pairs as measured, its picks 1.37x the
# best; with it 84% and 1.14x); they cannot tell 3 from 4 (1, 2 or 4 are ever resident).
WARPGROUPS_FOR_PEAK = 3
# dense, per SM; 3xTF32 issues three TF32 products per step
WGMMA_FLOP_PER_CYCLE = {"fp16": 4096, "bf16": 4096, "tf32": 2048, "3xtf32": 2048 / 3}


class Schedule(cost.Schedule):
    """What one schedule of the wgmma kernel (Tiling.schedule) owns: its shared memory, the
    registers its threads need, its own rules, the time the cost model (igemm.cost) gives its
    K-loop and epilogue, its candidates and its defines. The functions below ask the tiling's
    schedule (`schedule_of`); what every schedule shares stays in them."""

    warp_specialised = True  # a loader warpgroup beside the MMA warps, blocks per SM bounded
    mma_overhead = 56  # registers an MMA thread needs beside its accumulators
    splits_k = True  # a tiling's split_k may be above 1
    copies_by_tma = False  # its loaders may bring B by the copy engine (gather "tma")

    def tile_rows(self, t: Tiling) -> int:
        """A tile's rows (bm): 64 per warpgroup, the warpgroups stacked along M."""
        return 16 * t.warps_m

    def smem_bytes(self, t: Tiling, maths: str, shape: ConvShape | None) -> int:
        raise NotImplementedError

    def loader_registers(self, shape: ConvShape, t: Tiling, maths: str) -> int:
        raise NotImplementedError

    def tiling_problem(self, t: Tiling, maths: str) -> str:
        """The schedule's shape-independent rules, checked after those of every wgmma tiling
        (gather, warpgroups, bm, bk): N one of wgmma's, 3-8 stages, the shared memory."""
        if t.rows:
            return "rows are the halo schedule's: 0 for the others"
        if t.bn not in WGMMA_NS:
            return f"bn must be one of {', '.join(map(str, WGMMA_NS))}"
        if t.bn > MAX_BN.get(maths, t.bn):
            return (f"bn must be at most {MAX_BN[maths]} for {maths}: a thread holds two "
                    f"accumulator sets of bn/2 registers (the sum and a partial sum)")
        if not 3 <= t.stages <= 8:
            return "stages must be 3 to 8 (two K-tiles beyond the one the wgmmas read)"
        if t.split_k < 1:
            return "split_k must be at least 1"
        if self.smem_bytes(t, maths, None) > MAX_SMEM:
            return (f"needs {self.smem_bytes(t, maths, None)} bytes of shared memory; at most "
                    f"{MAX_SMEM}")
        return ""

    def layer_problem(self, shape: ConvShape, t: Tiling, maths: str) -> str:
        """The channels-last gather's rules, and rows a thread copies keeping one swizzle phase
        (8 | rows between them)."""
        problem = shape_problem(shape, t, NHWC, maths, MAX_WGMMA_ROWS)
        if problem:
            return problem
        if t.gather == "tma":
            return tensormap.im2col_problem(shape, t.bk, element_bytes(maths))
        step = t.loaders // (t.bk // channel_vector(shape.Cg, maths))
        if step % 8:
            return f"the gather's row step {step} must be a multiple of 8 for the swizzle"
        return ""

    def resident(self, shape: ConvShape, t: Tiling, maths: str) -> int:
        """Blocks an SM runs at once, for the cost model: its blocks per SM."""
        return blocks_per_sm(t, maths, shape)

    def kept_read(self, shape: ConvShape, t: Tiling, kept_bytes: int) -> float:
        """The kept read's DRAM time, KEPT_EXPOSURE times over, and KEPT_EXTRA_ROUND more of
        it for every wait of a thread's store past the first (kept_rounds)."""
        kept = shape.B * shape.M * shape.Ho * shape.Wo * kept_bytes / cost.DRAM_BYTES_PER_CYCLE
        return kept * KEPT_EXPOSURE * (1 + KEPT_EXTRA_ROUND * (kept_rounds(t) - 1))

    def options(self, shape: ConvShape, base: Tiling) -> list[Tiling]:
        """The schedule's tilings built on a grid-schedule `base` (candidates)."""
        return []

    def defines(self, shape: ConvShape, k: ConvShape, t: Tiling, maths: str) -> dict[str, int]:
        """The schedule's defines beside the layer's and the tiling's (`shape` as the user
        gave it, `k` the layer the kernel runs)."""
        raise NotImplementedError


def _issuing(t: Tiling, resident: int) -> float:
    """The share of the wgmma rate `resident` blocks of `t` issue at."""
    return min(1.0, resident * (t.warps_m // 4) / WARPGROUPS_FOR_PEAK)


def _mma_cycles(t: Tiling, maths: str) -> float:
    """A K-tile's wgmma cycles at the full rate: a narrow N re-reads A (less efficient), and a
    tail wgmma is charged as 32 columns."""
    columns = -(-t.bn // 32) * 32
    return 2 * t.bm * columns * t.bk / WGMMA_FLOP_PER_CYCLE[maths] * (1 + 32 / t.bn)


class Grid(Schedule):
    """A block per output tile (and K-split); every thread copies and multiplies."""

    name = "grid"
    warp_specialised = False

    def smem_bytes(self, t, maths, shape):
        stages = t.stages * (t.bm + t.bn) * a_parts(maths) * ROW_BYTES
        return max(stages, t.bn * (t.bm + 4) * 4) + SWIZZLE_ALIGN

    def resident(self, shape, t, maths):
        registers = -(-mma_registers(t, maths) // 8) * 8 * t.threads
        return max(1, min(H100.limits.registers_per_sm // registers,
                          blocks_per_sm(t, maths, shape)))

    def busy(self, shape, t, maths, waves, resident, k_count, epilogue):
        mma = _mma_cycles(t, maths)
        # waits for the loads' latency over the STAGES-2 tiles in flight, once per tile
        latency = cost.load_latency(shape, t, maths, k_count)
        k_tile = max(mma * resident / _issuing(t, resident), latency / (t.stages - 2)) / resident
        return waves * (k_count * k_tile + (latency + epilogue) / resident)

    def options(self, shape, base):
        return [replace(base, split_k=s) for s in cost.split_options(shape, base)]

    def defines(self, shape, k, t, maths):
        spans = maths == "3xtf32"
        return {"PART_KTILES": part_ktiles(shape.reduction, t, k_tiles(k, t)) if spans else 1}


class Persistent(Schedule):
    """A block per SM slot walks the tiles (or their K-splits): a loader warpgroup copies, the
    MMA warpgroups multiply, the stages passing between them on mbarriers (igemm.persistent)."""

    name = "persistent"
    copies_by_tma = True

    def smem_bytes(self, t, maths, shape):
        stages = t.stages * (t.bm + t.bn) * a_parts(maths) * ROW_BYTES
        scratch = STORE_SCRATCH * t.warps_m if maths in VECTOR_STORE_MATHS else 0
        return stages + 16 * t.stages + scratch + SWIZZLE_ALIGN

    def loader_registers(self, shape, t, maths):
        if t.gather == "tma":  # one thread's loop of two copies
            return TMA_LOADER_REGISTERS
        rows = vector_rows(t, channel_vector(shape.Cg, maths))
        return -(-(4 * rows + 40) // 8) * 8

    def tiling_problem(self, t, maths):
        if t.split_k > 1 and maths == "3xtf32" and t.warps_m == 8 and t.bn > 96:
            # NVRTC 12.9 spilled the split-K reduce's registers beside the two accumulator
            # sets of two warpgroups at bn 128; one warpgroup at bn 128, two at bn 96 and
            # every 16-bit and TF32 width built clean (2026-11-27)
            return ("3xTF32's persistent split-K with two warpgroups needs bn of at most 96 "
                    "(two accumulator sets)")
        return super().tiling_problem(t, maths)

    def busy(self, shape, t, maths, waves, resident, k_count, epilogue):
        mma = _mma_cycles(t, maths)
        # waits over STAGES-1 tiles in flight (all STAGES with the copy engine's gather, where
        # no loader waits to publish), once per block: the loaders run ahead into the next tile
        latency = cost.load_latency(shape, t, maths, k_count)
        in_flight = t.stages if t.gather == "tma" else t.stages - 1
        k_tile = max(mma * resident / _issuing(t, resident), latency / in_flight) / resident
        return waves * (k_count * k_tile + epilogue / resident) + latency

    def layer_problem(self, shape, t, maths):
        """As every schedule's, and a cluster's blocks in pairs of m-tiles of one group."""
        problem = super().layer_problem(shape, t, maths)
        mtiles = -(-(shape.M // shape.groups) // t.bm)
        if not problem and mtiles % t.cluster:
            problem = (f"a cluster of {t.cluster} blocks takes {t.cluster} m-tiles of a group: "
                       f"{shape.M // shape.groups} channels make "
                       f"{mtiles} tiles of {t.bm}")
        return problem

    def options(self, shape, base):
        found = []
        for s in cost.split_options(shape, base):
            found.append(replace(base, split_k=s, schedule=self.name))
            if base.gather == "tap":
                found.append(replace(base, split_k=s, schedule=self.name, gather="tma"))
                if s == 1:
                    found.append(replace(base, schedule=self.name, gather="tma", cluster=2))
        return found

    def defines(self, shape, k, t, maths):
        loaders, mma = register_split(k, t, maths)
        defines = {"PERSISTENT": 1, "MIN_BLOCKS": blocks_per_sm(t, maths, k),
                   "PRODUCER_REGS": loaders, "CONSUMER_REGS": mma,
                   "STORE_SCRATCH": STORE_SCRATCH, "CLUSTER": t.cluster}
        if t.gather == "tma":
            defines["GATHER_TMA"] = 1
        return defines


class Pingpong(Persistent):
    """As persistent, but its two MMA warpgroups take the block's units in turn, each a 64-row
    tile of its own (CUTLASS's ping-pong kernel schedule): while one stores its tile from the
    registers, the other's wgmmas run, where the persistent schedule's warpgroups, sharing one
    tile, leave the tensor cores idle through every epilogue. Per stage, half the A rows of a
    128-row tile, so more stages fit; each tile reads its B tile itself. No split-K and no
    clusters (the split-K meeting and the cluster's shared B copy assume one tile a block)."""

    name = "pingpong"
    splits_k = False

    def tile_rows(self, t):
        return 64

    def tiling_problem(self, t, maths):
        if t.warps_m != 8:
            return "the pingpong schedule runs two warpgroups, a tile each: warps_m 8"
        return super().tiling_problem(t, maths)

    def busy(self, shape, t, maths, waves, resident, k_count, epilogue):
        mma = _mma_cycles(t, maths)
        # the tensor cores see every tile's K-loop back to back; one epilogue, the last, shows.
        # It counts both warpgroups issuing, where the ordered K-loops let one issue at a time:
        # its own picks ran 0.50-0.84x of the own choice (H200), so no choice reads it
        # (preferred_pingpong); it orders the schedule's tilings among themselves alone.
        latency = cost.load_latency(shape, t, maths, k_count)
        in_flight = t.stages if t.gather == "tma" else t.stages - 1
        k_tile = max(mma * resident / _issuing(t, resident), latency / in_flight) / resident
        return waves * k_count * k_tile + epilogue + latency

    def options(self, shape, base):
        if base.warps_m != 4:
            return []
        found = [replace(base, warps_m=8, schedule=self.name)]
        if base.gather == "tap":
            found.append(replace(base, warps_m=8, schedule=self.name, gather="tma"))
        return found

    def defines(self, shape, k, t, maths):
        return {**super().defines(shape, k, t, maths), "PINGPONG": 1}


class Halo(Persistent):
    """As persistent, but a tile is `rows` whole output rows whose input patch is copied once
    for all the taps (igemm.halo); no split-K."""

    name = "halo"
    mma_overhead = HALO_OVERHEAD
    splits_k = False
    copies_by_tma = False

    def smem_bytes(self, t, maths, shape):
        if shape is None:
            raise ValueError("a halo tiling's shared memory depends on the layer: pass its shape")
        return halo.smem_bytes(shape, t, SWIZZLE_ALIGN)

    def loader_registers(self, shape, t, maths):
        return HALO_LOADER_REGISTERS  # no row origins, but the patch loop's

    def tiling_problem(self, t, maths):
        if maths == "3xtf32":
            return "the halo schedule runs fp16, bf16 and tf32 (3xTF32 would split the patches)"
        if t.gather != "tap":
            return "the halo schedule reads whole channel chunks: gather 'tap'"
        if t.bn % 8 or not 8 <= t.bn <= 256:
            return "bn must be a multiple of 8 from 8 to 256 (one wgmma's N)"
        if t.rows < 1:
            return "rows (output rows a tile) must be at least 1"
        if t.stages < 1 or t.stages * t.bm * ROW_BYTES > MAX_SMEM:
            return "stages (A's buffers) must be at least 1 and fit shared memory"
        return ""

    def layer_problem(self, shape, t, maths):
        """igemm.halo's rules and the patches' shared memory."""
        problem = halo.problem(shape, t, maths, k_tiles(shape, t))
        if not problem and self.smem_bytes(t, maths, shape) > MAX_SMEM:
            problem = (f"needs {self.smem_bytes(t, maths, shape)} bytes of shared memory; "
                       f"at most {MAX_SMEM}")
        return problem

    def busy(self, shape, t, maths, waves, resident, k_count, epilogue):
        mma = _mma_cycles(t, maths)
        # a K*K-th of its chunk's patch from L2 per K-tile and, unless the filters stay
        # resident, its A tile; the latency once per block
        a_bytes = 0 if t.stages == k_count else t.bm * ROW_BYTES
        l2 = halo.patch_rows(shape, t.bn) * ROW_BYTES / shape.taps + a_bytes
        k_tile = max(mma * resident / _issuing(t, resident),
                     l2 * resident / cost.L2_BYTES_PER_CYCLE) / resident
        return waves * (k_count * k_tile + epilogue / resident) + cost.LOAD_LATENCY

    def options(self, shape, base):
        return []

    def candidates(self, shape: ConvShape, maths: str) -> list[Tiling]:
        """One or two warpgroups, each row count whose N fits a wgmma, 2, 3, 4 or 6 A buffers
        (no more than the layer's K-tiles) and, where it fits, one per K-tile (resident
        filters)."""
        bk = k_elements(maths)
        found = []
        for warps, rows in itertools.product((8, 4), halo.row_options(shape)):
            base = Tiling(16 * warps, halo.halo_bn(shape, rows), bk, warps, 1, 2, 1, "tap",
                          self.name, rows)
            for stages in sorted({2, 3, 4, 6, k_tiles(shape, base)}):
                t = replace(base, stages=stages)
                if not tiling_problem(t, maths) and not layer_problem(shape, t, maths):
                    found.append(t)
        return found

    def defines(self, shape, k, t, maths):
        return {**super().defines(shape, k, t, maths), "HALO": 1, "HALO_ROWS": t.rows,
                "WGMMA_N": t.bn - t.bn % 32, "WGMMA_TAIL": t.bn % 32,
                "PATCH_STAGES": halo.PATCH_STAGES}


SCHEDULES = {s.name: s for s in (Grid(), Persistent(), Pingpong(), Halo())}


def schedule_of(t: Tiling) -> Schedule:
    """The Schedule object of the tiling's schedule (a name tiling_problem has accepted)."""
    return SCHEDULES[t.schedule]


def smem_bytes(t: Tiling, maths: str, shape: ConvShape | None = None) -> int:
    """The stages (A and B rows of 128 bytes, unpadded; both twice for 3xTF32's big and small
    parts) or the epilogue's C tile (the persistent schedule stores from registers and keeps
    two mbarriers per stage instead, and, but in 3xTF32, STORE_SCRATCH bytes a warp for its
    store's transpose), plus the alignment slack. The halo schedule's patches depend on the layer
    (`shape`, which it needs)."""
    return schedule_of(t).smem_bytes(t, maths, shape)


def blocks_per_sm(t: Tiling, maths: str, shape: ConvShape | None = None) -> int:
    """Blocks of `t` an SM holds (at most 2): as shared memory allows, and for the persistent
    and halo schedules, whose launch bounds ask ptxas for this many, as registers allow: ptxas
    fits the whole kernel in 65536 / (blocks x threads) registers a thread (rounded down to 8),
    and a wgmma holds its accumulators (twice for 3xTF32) at once, plus PERSISTENT_OVERHEAD."""
    per_block = smem_bytes(t, maths, shape) + H100.limits.reserved_shared_per_block
    blocks = max(1, min(2, H100.limits.shared_per_sm // per_block))
    if schedule_of(t).warp_specialised and blocks == 2:
        cap = H100.limits.registers_per_sm // (2 * t.block_threads)
        if a_parts(maths) * t.bn // 2 + PERSISTENT_OVERHEAD > cap - cap % 8:
            blocks = 1
    return blocks


def register_split(shape: ConvShape, t: Tiling, maths: str) -> tuple[int, int]:
    """setmaxnreg's counts for the warp-specialised schedules, (loaders, MMA threads), or
    (0, 0) where the cap every thread gets at launch already holds what an MMA thread is
    modelled to need (mma_registers). A loader keeps 4 registers per B row it copies (a 64-bit
    offset, two ints) and ~40 more (Schedule.loader_registers); what it gives up goes to the
    MMA threads."""
    schedule = schedule_of(t)
    if not schedule.warp_specialised:
        return 0, 0
    cap = min(255, H100.limits.registers_per_sm
              // (blocks_per_sm(t, maths, shape) * t.block_threads))
    cap -= cap % 8
    if mma_registers(t, maths) <= cap:
        return 0, 0
    loaders = schedule.loader_registers(shape, t, maths)
    mma = min(256, (cap * t.block_threads - loaders * t.loaders) // t.threads)
    mma -= mma % 8
    return (loaders, mma) if mma > cap else (0, 0)


def mma_registers(t: Tiling, maths: str) -> int:
    """Registers an MMA thread is modelled to need: its accumulators (twice for 3xTF32) and its
    schedule's overhead (~56; in the grid schedule the gather's row origins among them; the
    halo schedule's epilogue, which finds each output's row, takes HALO_OVERHEAD)."""
    return a_parts(maths) * t.bn // 2 + schedule_of(t).mma_overhead


# The add-relu epilogue's kept read (igemm.epilogue) is not hidden behind the K-loop: the
# consumers wait for it in their stores. Measured against the same tilings without the add,
# ResNet-50's four 1x1 expansions at batch 128 (H200, 2026-11-28): with fp16 kept and output
# (results/h200/resnet50-fp16-shortcuts-20261128/fused-tilings.log), where the tile was at most
# 128 columns wide, the add cost 1.4-1.6 times its bytes' time at the model's DRAM rate; at bn
# 192-256, 2.1-2.3 times; in the grid schedule's staged store, which has no read-ahead, 2.4-5.6
# times (counted as two turns). tf32 with float32 kept and output
# (results/h200/resnet50-tf32-fused-adds-20261128/fused-tilings.log), whose ring holds 64
# columns of float32 vectors, did the same by columns, not bytes: 1.0-1.8 times at bn <= 128
# with the copy engine's gather (2.0 and 2.7 for two tap-gather tilings of layers 3-4), 2.1-2.9
# at 192-256 (the L2 prefetch at the tile's start shortens each wait). Fused, 128x128 beat the
# plain conv's best tiling, 128x256, by 1.23-1.34x (fp16) and 1.71-1.82x (tf32) on layers 1-2.
KEPT_EXPOSURE = 1.4
KEPT_EXTRA_ROUND = 0.6
# The tile width a thread's store waits once for: measured, in both element sizes, not the
# ring's own size (64 columns of float32, 128 of fp16).
KEPT_RING_COLUMNS = 128


def stores_vectors(shape: ConvShape, maths: str, output_dtype) -> bool:
    """Whether the persistent schedule's register store of an add-relu conv takes its 16-byte
    path (persistent's VECTOR_STORE): 16-bit output of fp16 or bf16 maths, or float32 output
    of maths other than 3xTF32; a group's channels on 16 bytes."""
    vector = 16 // np.dtype(output_dtype).itemsize
    if vector == 8 and maths not in HALF_MATHS:
        return False
    return (maths in VECTOR_STORE_MATHS and shape.M % vector == 0
            and (shape.M // shape.groups) % vector == 0)


def kept_rounds(t: Tiling) -> int:
    """How many times a thread of the tiling's store waits for kept vectors: once per
    KEPT_RING_COLUMNS of the persistent (or pingpong) schedule's tile; the grid and halo
    schedules' stores, without a read-ahead, count as two."""
    if t.schedule not in ("persistent", "pingpong"):
        return 2
    return -(-t.bn // KEPT_RING_COLUMNS)


class WgmmaFamily(cost.Family):
    """The wgmma kernels as the cost model (igemm.cost) sees them."""

    def candidates(self, shape, maths):
        """Every valid tiling: one or two warpgroups, each N the instruction allows, 3-6
        stages, the tap gather (and the table where a group's channels are not a multiple of
        bk), and what each schedule builds on those (Schedule.options: `cost.split_options`'
        K-splits, each in the grid schedule and the persistent one, with the tap gather or the
        copy engine's ("tma"); the pingpong twins of the one-warpgroup ones, unsplit); and the
        halo schedule's tilings (Halo.candidates)."""
        bk = k_elements(maths)
        gathers = ["tap"] if shape.Cg % bk == 0 else ["tap", "table"]
        found = []
        for gather, warps, bn, stages in itertools.product(gathers, (8, 4), WGMMA_NS,
                                                           range(3, 7)):
            base = Tiling(16 * warps, bn, bk, warps, 1, stages, 1, gather)
            options = []
            for schedule in SCHEDULES.values():
                options += schedule.options(shape, base)
            found += [t for t in options
                      if not tiling_problem(t, maths) and not layer_problem(shape, t, maths)]
        return found + SCHEDULES["halo"].candidates(shape, maths)

    def schedule_of(self, t):
        return schedule_of(t)

    def tie_break(self, t):
        """The wider N (fewer A re-reads), then more stages."""
        return -t.bn, -t.stages


FAMILY = WgmmaFamily()


# The one-warpgroup persistent tilings the own choice trades for their pingpong twin: on an
# H200 (2026-11-29, results/h200/pingpong-20261129/), twins at the most stages ran UNet's and
# VGG-16's 64-channel 3x3 layers at batch 128 1.13-1.21x faster in tf32 and 1.11-1.13x in fp16
# (18 K-tiles in tf32, 9 in fp16; the own tilings ran two blocks an SM, three stages each),
# their 3-channel first layers 1.27-1.28x faster in tf32 and 0.99-1.00x in fp16 (one block an
# SM: one warpgroup of MMAs for the whole SM); ResNet-50's 7x7 stem (7 and 4 K-tiles, two
# blocks an SM) 0.88-0.93x slower. Against the two-warpgroup 128-row tilings the twins ran
# 0.72-1.07x, most within 4%: the own choice keeps those. 3xTF32 (three products a K-tile, the
# epilogue a smaller share of the time) was not timed, so the rule leaves it alone; bf16 runs
# fp16's instructions. On every suite cell the rule then took (95; H200, 2026-11-29,
# results/h200/pingpong-rule-20261129/), timed against the tiling it traded: where the twin
# runs one block an SM in place of two, it won on every layer of at most PINGPONG_MAX_FILTERS
# filters a group whose base gathered by tap or copy engine (24 cells, 1.03-1.18x), lost on 17
# of the 19 cells of 160 or 192 filters (0.86-1.03x: AlexNet's conv4, Inception-v3's 17x17
# layers) and on the one layer whose base gathered by table (Inception-v3's 5x5, 64 filters,
# 0.76-0.77x in every class); the rule keeps the base there. Once the copy engine took layers
# whose channels end in part of a box, that layer's base gathered by copy engine, and its twin
# lost again (H200, 2026-11-30, results/h200/suite-all-20261130/partial-boxes/: 0.84x fp16,
# 0.86x bf16): every twin of one block an SM that won had whole K-tiles of channels, so the
# rule asks for those (the table gather is offered only where they are not).
PINGPONG_MIN_KTILES = 8
PINGPONG_MAX_FILTERS = 128
PINGPONG_MATHS = ("tf32", "fp16", "bf16")


def pingpong_twin(shape: ConvShape, t: Tiling, maths: str) -> Tiling | None:
    """The pingpong tiling of an unsplit persistent tiling's N and gather, at the most stages
    a pingpong candidate of the layer has, or None."""
    if t.schedule != "persistent" or t.split_k != 1 or t.cluster != 1:
        return None
    twins = [p for p in cost.ranked(shape, maths, FAMILY)
             if p.schedule == "pingpong" and p.bn == t.bn and p.gather == t.gather]
    return max(twins, key=lambda p: p.stages) if twins else None


# The two-warpgroup 128-row tilings the own choice trades for a pingpong tiling of 64 rows and
# twice their N (the same tile area) where the layer's tiles fit one wave, one block an SM.
# Found on an H200 (2026-11-30, results/h200/one-wave-pingpong-20261130/): let the fitted
# correction rank pingpong tilings that split nothing and fit one wave, and its picks ran
# 0.60-1.33x against the own choice (233 cells, geomean 1.03x; 64-row tiles of a narrow N
# over K-splits of long reductions lost most), but where they halved an unsplit 128-row tile
# at least ONE_WAVE_MIN_N wide they ran 0.98-1.20x (28 suite cells, geomean 1.11x: UNet's and
# VGG-16's 3x3 layers at batch 1, ResNet-50's 14x14 and 7x7 layers at batch 32; 0.92-1.22x
# where N was 32). Checked on the 33 cells of random layers (none of them in the suites) the
# rule then took: 19 gathering by copy engine ran 0.99-1.15x (geomean 1.12x), 14 gathering by
# table 0.76-1.01x, as the pingpong tilings of a table gather lost before (preferred_pingpong),
# so the rule leaves those alone. As it stands, on the 47 cells it takes: 0.99-1.20x, geomean
# 1.11x, none slower by over 3%. Each table-gathered layer had channels ending in part of a
# K-tile, and each copy-engine one whole K-tiles; since the copy engine takes the former too
# (2026-11-30), the rule asks for whole K-tiles, as preferred_pingpong does.
ONE_WAVE_MIN_N = 64


def one_wave_pingpong(shape: ConvShape, t: Tiling, maths: str) -> Tiling | None:
    """The pingpong tiling the own choice takes in place of `t`, or None: t an unsplit
    two-warpgroup 128-row tiling of PINGPONG_MATHS, persistent or a halo tiling of one row
    (the only halo tilings timed: a taller one's N counts the padded rows' positions, so twice
    it is no tile of the same area), at least ONE_WAVE_MIN_N wide, on a layer whose channels
    fill whole K-tiles and whose tiles the SMs hold at once; the pingpong tiling 64 rows and 2N
    wide, unsplit, at its most stages, gathering as t does (a halo tiling's by the copy engine, else
    by tap)."""
    if (maths not in PINGPONG_MATHS or (t.bm, t.warps_m, t.split_k, t.cluster) != (128, 8, 1, 1)
            or not (t.schedule == "persistent" or (t.schedule == "halo" and t.rows == 1))
            or shape.Cg % t.bk or t.bn < ONE_WAVE_MIN_N or output_tiles(shape, t) > cost.SMS):
        return None
    gathers = ("tma", "tap") if t.schedule == "halo" else (t.gather,)
    for gather in gathers:
        twins = [p for p in cost.ranked(shape, maths, FAMILY)
                 if p.schedule == "pingpong" and p.split_k == 1 and p.bn == 2 * t.bn
                 and p.gather == gather and output_tiles(shape, p) <= cost.SMS]
        if twins:
            return max(twins, key=lambda p: p.stages)
    return None


def preferred_pingpong(shape: ConvShape, t: Tiling, maths: str) -> Tiling | None:
    """The pingpong twin the own choice takes in place of `t`, or None: t a one-warpgroup
    persistent tiling of PINGPONG_MATHS whose K-loop is at least PINGPONG_MIN_KTILES long or
    that runs one block an SM, and the layer at least two 64-row tiles for every block the
    twin's grid holds, so that both warpgroups of every block have tiles. A twin that runs
    fewer blocks an SM than `t` needs a layer of at most PINGPONG_MAX_FILTERS filters a group
    whose channels fill whole K-tiles (no table gather, nor a copy-engine box partly
    zero-filled)."""
    if t.warps_m != 4 or maths not in PINGPONG_MATHS:
        return None
    twin = pingpong_twin(shape, t, maths)
    if twin is None:
        return None
    twin_blocks, base_blocks = blocks_per_sm(twin, maths, shape), blocks_per_sm(t, maths, shape)
    if output_tiles(shape, twin) < 2 * cost.SMS * twin_blocks:
        return None
    if k_tiles(shape, t) < PINGPONG_MIN_KTILES and base_blocks > 1:
        return None
    if twin_blocks < base_blocks and (shape.Mg > PINGPONG_MAX_FILTERS or shape.Cg % t.bk):
        return None
    return twin
