"""pipelined: CUTLASS-style implicit-GEMM convolution on tensor cores, one source, four maths.

MODE 0 TF32 (mma.m16n8k8), 1 error-compensated 3xTF32, 2 FP16 and 3 BF16 (mma.m16n8k16, FP32
accumulation). The tiling (block tile, warp grid, K-tile, stages, split-K, gather order) is a
compile-time choice: `configs()` lists the ones worth trying for a shape, `configured()` fixes
one, and without a fixed one a cost model (`estimate`) picks it.
"""

SOURCE = r"""
// pipelined: changes from tensorcore -- that kernel staged a block's input rows in shared memory
// once and gathered every MMA operand from there through an offset table: two shared loads per
// MMA kept it bound by the load/store unit (29% of its floor). Here each operand tile is copied
// global -> shared with cp.async, STAGES tiles in flight, one barrier per K-tile, and read back
// in fragment form with a single conflict-free load per fragment register (A: one 16-byte load,
// packed by the host in fragment order; B: rows padded to BN+8 so the 32 lanes of a fragment
// read hit 32 banks; FP16: ldmatrix.trans). Warp tiles up to 64x64 feed 32 MMAs per 16 fragment
// loads, so the tensor pipe, not shared memory, sets the pace. The im2col operand B is gathered
// on the fly: with GATHER_TAP the K order is (channel chunk, filter tap, channel), so a
// thread's BK/..-element column of a K-tile shares one tap: one bounds test and one address per
// column, then a 4-byte cp.async per element at a compile-time stride (src-size 0 writes the
// zeros of the padding); otherwise (few channels, e.g. AlexNet conv1) K runs in the weights'
// own (c, p, q) order and a table gives each k its offset and (p, q). Groups, M-tiles, N-tiles
// and K-splits are one launch; split-K partial tiles are reduced by the last block to finish,
// in split order (deterministic). The epilogue stages the tile in shared memory so stores run
// along pixels, adds the bias and applies ReLU.
//
// Compile-time: C H W M K STRIDE PAD G (shape), HAS_BIAS RELU, MODE, BM BN BK WARPS_M WARPS_N
// STAGES SPLIT_K GATHER_TAP (tiling).

#define HALF (MODE >= 2)
#if HALF
typedef unsigned short elem_t;  // fp16 / bf16 bits, staged outside the timed region
#define ELEM_BYTES 2
#else
typedef float elem_t;
#define ELEM_BYTES 4
#endif
#define CG (C / G)
#define MG (M / G)
#define HO ((H + 2 * PAD - K) / STRIDE + 1)
#define WO ((W + 2 * PAD - K) / STRIDE + 1)
#define HWI (H * W)
#define HWO (HO * WO)
#define KK (K * K)
#define NWARPS (WARPS_M * WARPS_N)
#define THREADS (32 * NWARPS)
#define WM (BM / WARPS_M)
#define WN (BN / WARPS_N)
#define MF (WM / 16)
#define NF (WN / 8)
#define KSTEP (HALF ? 16 : 8)
#define KSTEPS (BK / KSTEP)
#define MTILES ((MG + BM - 1) / BM)
#if GATHER_TAP
#define CCHUNKS ((CG + BK - 1) / BK)
#define KTILES (CCHUNKS * KK)
#else
#define KTILES ((CG * KK + BK - 1) / BK)
#endif
// B gather: COLT threads side by side along the tile's pixels, each owning NCOLS pixel columns
// and RPT consecutive k rows of every K-tile.
#define COLT (THREADS < BN ? THREADS : BN)
#define NCOLS (BN / COLT)
#define RPT (BK * COLT / THREADS)
#define A_PARTS (MODE == 1 ? 2 : 1)
#define A_WORDS (BM * BK * A_PARTS * ELEM_BYTES / 4)
#define A_VECS (A_WORDS / 4)
#define B_LD (BN + 8)
#define B_WORDS (BK * B_LD * ELEM_BYTES / 4)
#define STAGE_WORDS (A_WORDS + B_WORDS)
#define C_LD (BN + 8)

// In bounds: without padding every tap of a real pixel lies inside the image (ho*S + p <= H-1
// by the definition of HO), so only columns past the last pixel (ih0 < 0) and, for the table,
// k past the reduction gather zeros, and the table's offsets are all a k needs.
#if PAD == 0
#define TAP_OK(i, p, q) (ih0[i] >= 0)
#else
#define TAP_OK(i, p, q) \
    ((unsigned)(ih0[i] + (p)) < (unsigned)H && (unsigned)(iw0[i] + (q)) < (unsigned)W)
#endif

__device__ __forceinline__ unsigned smem_u32(const void* p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
}

// src-size 0 copies nothing and zero-fills the 4 bytes: padding taps and rows past the
// reduction become zeros without a branch (src is never dereferenced then).
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool ok)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(ok ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ unsigned to_tf32(float f)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2])
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#if HALF
#if MODE == 2
#define MMA16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
#define MMA16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
__device__ __forceinline__ void mma_16(float (&d)[4], const uint4& a, const unsigned (&b)[2])
{
    asm volatile(
        MMA16 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 b16 matrices, transposed: from B stored [k][n], lane (g, t) receives (k 2t, 2t+1; n g)
// of each, exactly the m16n8k16 B fragment register.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2,
                                                  unsigned& r3, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
#endif

// wpack: the filters as A fragments, [G][MTILES][KTILES][A_PARTS][BM/16][KSTEPS][32 lanes][16 B]
// (host-packed, zero-padded); table: per k {offset c*H*W+p*W+q, p, q, 0} when !GATHER_TAP;
// ws, counters: split-K partial tiles and arrival counts (all counts zero between launches).
extern "C" __global__ void __launch_bounds__(THREADS)
conv_forward(const elem_t* __restrict__ x, const float4* __restrict__ wpack,
             const int4* __restrict__ table, const float* __restrict__ bias,
             float* __restrict__ y, float* __restrict__ ws, int* __restrict__ counters, int batch)
{
    extern __shared__ __align__(16) float smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int split = blockIdx.x % SPLIT_K;
    const int tile = blockIdx.x / SPLIT_K;  // m-tile fastest: neighbours share their input tile
    const int mtile = tile % MTILES;
    const int ntile = tile / MTILES;
    const int group = blockIdx.y;
    const int npix = batch * HWO;  // < 2^31, checked by the host

    // This thread's pixel columns: where their receptive field starts. A column past the last
    // pixel gets a row origin that fails every bounds test, so it gathers zeros.
    const int col0 = tid % COLT;
    const int r0 = (tid / COLT) * RPT;
    long long off[NCOLS];
    int ih0[NCOLS], iw0[NCOLS];
#pragma unroll
    for (int i = 0; i < NCOLS; ++i) {
        const int n = ntile * BN + col0 + i * COLT;
        if (n < npix) {
            const int b = n / HWO, r = n - b * HWO;
            const int ho = r / WO, wo = r - ho * WO;
            ih0[i] = ho * STRIDE - PAD;
            iw0[i] = wo * STRIDE - PAD;
            off[i] = ((long long)b * C + group * CG) * HWI + ih0[i] * W + iw0[i];
        } else {
            ih0[i] = -(1 << 29);
            iw0[i] = 0;
            off[i] = 0;
        }
    }

    const float4* wtiles = wpack + (long long)(group * MTILES + mtile) * KTILES * A_VECS;
    auto load_a = [&](int stage, int kt) {
        float* sa = smem + stage * STAGE_WORDS;
        const float4* src = wtiles + (long long)kt * A_VECS;
#pragma unroll
        for (int v = 0; v < (A_VECS + THREADS - 1) / THREADS; ++v) {
            const int idx = tid + v * THREADS;
            if (A_VECS % THREADS == 0 || idx < A_VECS)
                cp_async16(smem_u32(sa + idx * 4), src + idx);
        }
    };

#if HALF
    elem_t bv[NCOLS][RPT];  // the next K-tile's B elements, in flight while this one computes
    auto gather_b = [&](int kt) {
#if GATHER_TAP
        const int cc = kt / KK, tap = kt - cc * KK, p = tap / K, q = tap - p * K;
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
#if PAD == 0
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
        const int cc = kt / KK, tap = kt - cc * KK, p = tap / K, q = tap - p * K;
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
#if PAD == 0
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

    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    auto compute = [&](int stage) {
        const float* sa = smem + stage * STAGE_WORDS;
#if HALF
        const uint4* sa4 = reinterpret_cast<const uint4*>(sa);
        const unsigned sb = smem_u32(sa + A_WORDS);
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s) {
            uint4 a[MF];
            unsigned b[NF][2];
#pragma unroll
            for (int i = 0; i < MF; ++i) a[i] = sa4[((wm * MF + i) * KSTEPS + s) * 32 + lane];
#pragma unroll
            for (int j = 0; j < NF; j += 2) {
                // lanes 0-7: k 0-7 of n-tile j, 8-15: k 8-15, 16-23 / 24-31: the same for j+1
                const int row = s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int col = wn * WN + (j + (lane >> 4)) * 8;
                ldmatrix_x4_trans(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                                  sb + (row * B_LD + col) * 2);
            }
#pragma unroll
            for (int i = 0; i < MF; ++i)
#pragma unroll
                for (int j = 0; j < NF; ++j) mma_16(acc[i][j], a[i], b[j]);
        }
#else
        const float4* sa4 = reinterpret_cast<const float4*>(sa);
        const float* sb = sa + A_WORDS;
#if MODE == 1
        // This K-tile's products go to a fresh accumulator, added to the running sum with an
        // FP32 add (round to nearest): the tensor cores' truncating accumulation then acts on
        // 3*BK/8 additions of one tile's size, not on the whole reduction.
        float part[MF][NF][4];
#pragma unroll
        for (int i = 0; i < MF; ++i)
#pragma unroll
            for (int j = 0; j < NF; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
#endif
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s) {
            unsigned a[MF][4], b[NF][2];
#pragma unroll
            for (int i = 0; i < MF; ++i) {
                const float4 v = sa4[((wm * MF + i) * KSTEPS + s) * 32 + lane];
                a[i][0] = __float_as_uint(v.x); a[i][1] = __float_as_uint(v.y);
                a[i][2] = __float_as_uint(v.z); a[i][3] = __float_as_uint(v.w);
            }
#if MODE == 1
            unsigned al[MF][4], bl[NF][2];
#pragma unroll
            for (int i = 0; i < MF; ++i) {
                const float4 v = sa4[BM * BK / 4 + ((wm * MF + i) * KSTEPS + s) * 32 + lane];
                al[i][0] = __float_as_uint(v.x); al[i][1] = __float_as_uint(v.y);
                al[i][2] = __float_as_uint(v.z); al[i][3] = __float_as_uint(v.w);
            }
#endif
#pragma unroll
            for (int j = 0; j < NF; ++j) {
                const float* bp = sb + (s * 8 + t4) * B_LD + wn * WN + j * 8 + g8;
                const float f0 = bp[0], f1 = bp[4 * B_LD];
                b[j][0] = to_tf32(f0);
                b[j][1] = to_tf32(f1);
#if MODE == 1
                bl[j][0] = to_tf32(f0 - __uint_as_float(b[j][0]));
                bl[j][1] = to_tf32(f1 - __uint_as_float(b[j][1]));
#endif
            }
#pragma unroll
            for (int i = 0; i < MF; ++i)
#pragma unroll
                for (int j = 0; j < NF; ++j) {
#if MODE == 1
                    mma_tf32(part[i][j], al[i], b[j]);
                    mma_tf32(part[i][j], a[i], bl[j]);
                    mma_tf32(part[i][j], a[i], b[j]);
#else
                    mma_tf32(acc[i][j], a[i], b[j]);
#endif
                }
        }
#if MODE == 1
#pragma unroll
        for (int i = 0; i < MF; ++i)
#pragma unroll
            for (int j = 0; j < NF; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
#endif
#endif
    };

    const int kbeg = (int)((long long)split * KTILES / SPLIT_K);
    const int nk = (int)((long long)(split + 1) * KTILES / SPLIT_K) - kbeg;
#if HALF
    // Two stages: A by cp.async, B (2-byte elements, below cp.async's 4-byte minimum) through
    // registers: loads for tile it+1 are issued before tile it's MMAs and stored after them.
    if (nk > 0) {
        load_a(0, kbeg);
        cp_async_commit();
        gather_b(kbeg);
        store_b(0);
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int it = 0; it < nk; ++it) {
        const int cur = it & 1;
        const bool more = it + 1 < nk;
        if (more) {
            load_a(cur ^ 1, kbeg + it + 1);
            gather_b(kbeg + it + 1);
        }
        cp_async_commit();
        compute(cur);
        if (more) store_b(cur ^ 1);
        cp_async_wait<0>();
        __syncthreads();
    }
#else
    // STAGES-1 tiles in flight. At iteration it, after the barrier, every thread has finished
    // computing tile it-1, so its stage ((it+STAGES-1) % STAGES) may be refilled; wait_group
    // STAGES-2 before the barrier means tile it (group it) has landed for this thread, the
    // barrier that it has for all. A group is committed every iteration, empty or not, to keep
    // that count exact.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_tile(s, kbeg + s);
        cp_async_commit();
    }
    int read_stage = 0, write_stage = STAGES - 1;
    for (int it = 0; it < nk; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (it + STAGES - 1 < nk) load_tile(write_stage, kbeg + it + STAGES - 1);
        cp_async_commit();
        compute(read_stage);
        read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
        write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages before the C tile overwrites them
#endif

#if SPLIT_K > 1
    {
        // Each split writes its partial tile (thread-private order: coalesced, and read back by
        // the same thread of whichever block finishes last), then counts itself in. The last
        // one adds the partials in split order, so the result does not depend on arrival order.
        __shared__ int last;
        const long long tile_id = (long long)group * (gridDim.x / SPLIT_K) + tile;
        float* parts = ws + tile_id * (SPLIT_K * BM * BN);
        float* flat = &acc[0][0][0];
#pragma unroll
        for (int e = 0; e < MF * NF * 4; ++e)
            __stcg(parts + split * (BM * BN) + e * THREADS + tid, flat[e]);
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(counters + tile_id, 1) == SPLIT_K - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int e = 0; e < MF * NF * 4; ++e) {
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < SPLIT_K; ++s)
                sum += s == split ? flat[e] : __ldcg(parts + s * (BM * BN) + e * THREADS + tid);
            flat[e] = sum;
        }
        if (tid == 0) counters[tile_id] = 0;
    }
#endif

    // Accumulator (i, j) element e: row 16i + g + 8*(e/2), column 8j + 2t + e%2 of the warp tile.
    float* cs = smem;
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            const int row = wm * WM + i * 16 + g8, col = wn * WN + j * 8 + 2 * t4;
            float2* upper = reinterpret_cast<float2*>(cs + row * C_LD + col);
            float2* lower = reinterpret_cast<float2*>(cs + (row + 8) * C_LD + col);
            *upper = make_float2(acc[i][j][0], acc[i][j][1]);
            *lower = make_float2(acc[i][j][2], acc[i][j][3]);
        }
    __syncthreads();

    // A warp stores one channel row at a time, lanes along consecutive pixels.
    long long yoff[BN / 32];
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int n = ntile * BN + lane + 32 * i;
        if (n < npix) {
            const int b = n / HWO;
            yoff[i] = ((long long)b * M + group * MG) * HWO + (n - b * HWO);
        } else {
            yoff[i] = -1;
        }
    }
    for (int m = warp; m < BM; m += NWARPS) {
        const int mg = mtile * BM + m;
        if (mg >= MG) break;
#if HAS_BIAS
        const float bias_m = __ldg(bias + group * MG + mg);
#endif
#pragma unroll
        for (int i = 0; i < BN / 32; ++i) {
            if (yoff[i] < 0) continue;
            float v = cs[m * C_LD + lane + 32 * i];
#if HAS_BIAS
            v += bias_m;
#endif
#if RELU
            v = v < 0.0f ? 0.0f : v;  // NaN stays NaN
#endif
            y[yoff[i] + (long long)mg * HWO] = v;
        }
    }
}
"""

import itertools  # noqa: E402
import math  # noqa: E402
from dataclasses import dataclass, fields  # noqa: E402
from functools import lru_cache  # noqa: E402

import numpy as np  # noqa: E402

from ..errors import ConvlabError  # noqa: E402
from ..gpu.hardware import H100  # noqa: E402
from ..shapes import FEATURES, ConvShape  # noqa: E402
from .base import (RELU, Config, Op, Support, Variant, blocks, check_inputs, device_weights,  # noqa: E402
                   split_tf32_arithmetic)
from .tensorcore import round_tf32  # noqa: E402

MODES = {"tf32": 0, "3xtf32": 1, "fp16": 2, "bf16": 3}
HALF_MATHS = ("fp16", "bf16")
# Dynamic shared memory per block: sm_90 allows 227 KB in all, and split-K adds a static word.
MAX_SMEM = 226 * 1024
INT32_MAX = 2**31 - 1
INVALID_TAP = 1 << 28  # the (p, q) a table gives k past the reduction: fails every bounds test
MAX_CONFIGS = 16  # configs() returns the cost model's best this many
# Accumulator registers a thread may hold: 64x64 warp tiles; 3xTF32 keeps a second set per
# K-tile (the round-to-nearest tile sum), so its warp tiles stop at 64x32.
MAX_ACC = {"tf32": 128, "3xtf32": 64, "fp16": 128, "bf16": 128}
# fp16/bf16 B elements a thread carries in registers from one K-tile's loads to its stores:
# beyond 32, a 64x64 warp tile's 128 accumulators no longer fit beside them (ptxas spills).
MAX_IN_FLIGHT = 32


@dataclass(frozen=True)
class Tiling(Config):
    """One point of the tiling space: block tile bm x bn x bk, a warps_m x warps_n warp grid,
    `stages` shared-memory buffers, `split_k` K-splits, and the gather order ("tap": K runs
    (channel chunk, tap, channel) and needs bk channels per chunk; "table": K in the weights'
    (c, p, q) order through an offset table)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    split_k: int
    gather: str

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def wm(self) -> int:
        return self.bm // self.warps_m

    @property
    def wn(self) -> int:
        return self.bn // self.warps_n

    @property
    def accumulators(self) -> int:
        return (self.wm // 16) * (self.wn // 8) * 4

    @property
    def column_threads(self) -> int:
        return min(self.threads, self.bn)

    @property
    def rows_per_thread(self) -> int:
        return self.bk * self.column_threads // self.threads

    def brief(self) -> str:
        """'128x128x32 2x2w s3 k1 tap': short enough for an 80-column table."""
        return (f"{self.bm}x{self.bn}x{self.bk} {self.warps_m}x{self.warps_n}w s{self.stages} "
                f"k{self.split_k} {self.gather}")


def k_step(maths: str) -> int:
    return 16 if maths in HALF_MATHS else 8


def a_parts(maths: str) -> int:
    return 2 if maths == "3xtf32" else 1


def element_bytes(maths: str) -> int:
    return 2 if maths in HALF_MATHS else 4


def smem_bytes(t: Tiling, maths: str) -> int:
    """The pipeline's stages, or the epilogue's C tile that reuses them, whichever is larger."""
    e = element_bytes(maths)
    stage = t.bm * t.bk * a_parts(maths) * e + t.bk * (t.bn + 8) * e
    return max(t.stages * stage, t.bm * (t.bn + 8) * 4)


def tiling_problem(t: Tiling, maths: str) -> str:
    """Why `t` cannot be compiled for `maths`, or "" if it can (shape-independent rules)."""
    ints = {f.name: getattr(t, f.name) for f in fields(t) if f.name != "gather"}
    bad = [n for n, v in ints.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:
        return f"{', '.join(bad)} must be positive integers"
    if t.gather not in ("tap", "table"):
        return f"gather must be 'tap' or 'table', not {t.gather!r}"
    if t.warps_m * t.warps_n not in (4, 8):
        return "the warp grid must hold 4 or 8 warps (128 or 256 threads)"
    if t.bm % (16 * t.warps_m):
        return f"bm={t.bm} must be a multiple of 16*warps_m={16 * t.warps_m}"
    tile_n = 16 if maths in HALF_MATHS else 8  # ldmatrix.x4 loads two 8-column B tiles
    if t.bn % 32 or t.bn % (tile_n * t.warps_n):
        return f"bn={t.bn} must be a multiple of 32 and of {tile_n}*warps_n={tile_n * t.warps_n}"
    if t.bk % k_step(maths):
        return f"bk={t.bk} must be a multiple of the MMA's k={k_step(maths)}"
    if t.bn % t.threads and t.threads % t.bn:
        return f"bn={t.bn} and the {t.threads} threads must divide one another"
    if t.bk % (t.threads // t.column_threads):
        return f"bk={t.bk} must split evenly over {t.threads // t.column_threads} thread rows"
    if t.accumulators > MAX_ACC[maths]:
        return (f"a {t.wm}x{t.wn} warp tile needs {t.accumulators} accumulators per thread; "
                f"{maths} allows {MAX_ACC[maths]}")
    if maths in HALF_MATHS and t.stages != 2:
        return f"{maths} stages B through registers into 2 buffers: stages must be 2"
    in_flight = t.rows_per_thread * (t.bn // t.column_threads)
    if maths in HALF_MATHS and in_flight > MAX_IN_FLIGHT:
        return (f"each thread would hold {in_flight} B elements in registers between K-tiles; "
                f"at most {MAX_IN_FLIGHT} (fewer bk*bn per thread)")
    if t.stages > 6:
        return "stages must be at most 6"
    if smem_bytes(t, maths) > MAX_SMEM:
        return f"needs {smem_bytes(t, maths)} bytes of shared memory; at most {MAX_SMEM}"
    return ""


def k_tiles(shape: ConvShape, t: Tiling) -> int:
    kk = shape.K * shape.K
    if t.gather == "tap":
        return blocks(shape.Cg, t.bk) * kk
    return blocks(shape.Cg * kk, t.bk)


def m_tiles(shape: ConvShape, t: Tiling) -> int:
    return blocks(shape.Mg, t.bm)


def n_tiles(shape: ConvShape, t: Tiling) -> int:
    return blocks(shape.B * shape.Ho * shape.Wo, t.bn)


def output_tiles(shape: ConvShape, t: Tiling) -> int:
    return shape.groups * m_tiles(shape, t) * n_tiles(shape, t)


def shape_problem(shape: ConvShape, t: Tiling) -> str:
    """Why `t` cannot run `shape` (32-bit index limits, too many K-splits), or ""."""
    if shape.B * shape.Ho * shape.Wo + t.bn > INT32_MAX:
        return (f"B*Ho*Wo = {shape.B * shape.Ho * shape.Wo} pixels overflow the kernel's "
                f"32-bit pixel index")
    channels = blocks(shape.Cg, t.bk) * t.bk if t.gather == "tap" else shape.Cg
    if channels * shape.H * shape.W > INT32_MAX:
        return "one group's input channels exceed the kernel's 32-bit in-image offsets"
    if t.split_k > k_tiles(shape, t):
        return f"split-K {t.split_k} exceeds the {k_tiles(shape, t)} K-tiles of this layer"
    return ""


# --- host-side operand preparation -------------------------------------------------------------

def gemm_weights(weights: np.ndarray, shape: ConvShape, t: Tiling) -> np.ndarray:
    """The filters as the kernel's A matrices, [G][MTILES*bm][KTILES*bk], zero-padded, with the
    columns in the kernel's k order: (c, p, q) for "table"; for "tap" k = (chunk*KK + tap)*bk + j
    holds channel chunk*bk + j at filter tap (p, q) = divmod(tap, K)."""
    G, Mg, Cg, kk = shape.groups, shape.Mg, shape.Cg, shape.K * shape.K
    w = np.asarray(weights, dtype=np.float32).reshape(G, Mg, Cg, kk)
    a = np.zeros((G, m_tiles(shape, t) * t.bm, k_tiles(shape, t) * t.bk), dtype=np.float32)
    if t.gather == "tap":
        chunks = blocks(Cg, t.bk)
        padded = np.zeros((G, Mg, chunks * t.bk, kk), dtype=np.float32)
        padded[:, :, :Cg] = w
        tapwise = padded.reshape(G, Mg, chunks, t.bk, kk).transpose(0, 1, 2, 4, 3)
        a[:, :Mg] = tapwise.reshape(G, Mg, -1)
    else:
        a[:, :Mg, :Cg * kk] = w.reshape(G, Mg, Cg * kk)
    return a


def split_tf32(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a = big + small (to ~2^-22 relative): both TF32 values, small = the rounded residual."""
    big = round_tf32(a)
    return big, round_tf32(a - big)


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def fragment_order(a: np.ndarray, t: Tiling, half: bool) -> np.ndarray:
    """[G][rows][cols] -> [G][MTILES][KTILES][bm*bk] in mma fragment order (lane g*4+t).

    m16n8k8 TF32: lane (g, t) of row tile i, k-step s holds a0..a3 = (g, t), (g+8, t), (g, t+4),
    (g+8, t+4), i.e. register h + 2e for row g + 8h, k t + 4e. m16n8k16 16-bit: registers
    (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..): half h + 2*e8 for row g + 8h,
    k 8*e8 + 2t + e1, with e1 the low/high half of the register.
    """
    G, rows, cols = a.shape
    mt, kt = rows // t.bm, cols // t.bk
    if half:
        v = a.reshape(G, mt, t.bm // 16, 2, 8, kt, t.bk // 16, 2, 4, 2)
        # axes: G, mt, i, h, g, kt, s, e8, t, e1 -> G, mt, kt, i, s, g, t, e8, h, e1
        v = v.transpose(0, 1, 5, 2, 6, 4, 8, 7, 3, 9)
    else:
        v = a.reshape(G, mt, t.bm // 16, 2, 8, kt, t.bk // 8, 2, 4)
        # axes: G, mt, i, h, g, kt, s, e, t -> G, mt, kt, i, s, g, t, e, h
        v = v.transpose(0, 1, 5, 2, 6, 4, 8, 7, 3)
    return np.ascontiguousarray(v).reshape(G, mt, kt, t.bm * t.bk)


def pack_weights(weights: np.ndarray, shape: ConvShape, t: Tiling, maths: str) -> np.ndarray:
    """What the kernel's `wpack` holds: per (group, m-tile, k-tile) the A parts in fragment
    order, TF32-rounded (tf32), split big + small (3xtf32), or as fp16 / bf16 bits."""
    a = gemm_weights(weights, shape, t)
    if maths == "tf32":
        parts = [round_tf32(a)]
    elif maths == "3xtf32":
        parts = list(split_tf32(a))
    elif maths == "fp16":
        parts = [a.astype(np.float16).view(np.uint16)]
    else:
        parts = [to_bf16_bits(a)]
    half = maths in HALF_MATHS
    return np.ascontiguousarray(np.stack([fragment_order(p, t, half) for p in parts], axis=3))


def gather_table(shape: ConvShape, t: Tiling) -> np.ndarray:
    """The "table" gather's int4 per k: (c*H*W + p*W + q, p, q, 0); k past the reduction gets
    an offset of 0 and p = INVALID_TAP, so its bounds test fails and it gathers a zero."""
    kk = shape.K * shape.K
    k = np.arange(k_tiles(shape, t) * t.bk)
    c, tap = k // kk, k % kk
    p, q = tap // shape.K, tap % shape.K
    valid = k < shape.Cg * kk
    table = np.zeros((k.size, 4), dtype=np.int32)
    table[:, 0] = np.where(valid, c * shape.H * shape.W + p * shape.W + q, 0)
    table[:, 1] = np.where(valid, p, INVALID_TAP)
    table[:, 2] = np.where(valid, q, 0)
    return table


# --- choosing tilings: a cost model over the candidates -----------------------------------------

# H100 SXM figures the model ranks tilings with (only ratios matter): MMA instructions an SM
# retires per cycle (322 TFLOP/s of m16n8k8 TF32 = 2,048 FLOP each, 132 SMs, ~1.76 GHz; the
# m16n8k16 16-bit MMA is assumed to take the same time for twice the work), shared-memory and
# L2 bytes per SM per cycle, warp instructions issued per SM per cycle, DRAM bytes per cycle for
# the whole GPU, and the latency a K-tile's loads must hide.
SMS = H100.sms
MMA_PER_CYCLE = 0.68
SMEM_BYTES_PER_CYCLE = 128
L2_BYTES_PER_CYCLE = 48
ISSUE_PER_CYCLE = 4
DRAM_BYTES_PER_CYCLE = 1700
LOAD_LATENCY = 700
BARRIER_CYCLES = 30
CLOCK_MHZ = 1755
REGISTERS = H100.limits.registers_per_sm
# Fraction of the binding rate a well-fed pipeline sustains (issue conflicts, tails).
SUSTAINED = 0.85


def gather_options(shape: ConvShape, maths: str) -> list[tuple[str, int]]:
    """(gather, bk) pairs worth trying, best first: tap order with a bk that divides the group's
    channels; else whichever of tap (channels padded to bk) and table (reduction padded to bk)
    pads less, the table's per-element bounds test counted as 25% more work."""
    step = k_step(maths)
    sizes = [bk for bk in (32, 64, 16, 48) if bk % step == 0]
    exact = [("tap", bk) for bk in sizes if shape.Cg % bk == 0]
    if exact:
        return exact[:2]
    kk = shape.K * shape.K
    options = [("tap", bk) for bk in sizes[:2]]
    options += [("table", bk) for bk in (32, 16) if bk % step == 0]

    def work(option):
        gather, bk = option
        if gather == "tap":
            padded = blocks(shape.Cg, bk) * bk * kk
        else:
            padded = blocks(shape.Cg * kk, bk) * bk
        return padded * (1.25 if gather == "table" else 1.0)

    return sorted(options, key=work)[:2]


def estimate_registers(t: Tiling, maths: str) -> int:
    mf, nf = t.wm // 16, t.wn // 8
    sets = 2 if maths == "3xtf32" else 1
    fragments = sets * (mf * 4 + nf * 2)
    in_flight = t.rows_per_thread * (t.bn // t.column_threads) if maths in HALF_MATHS else 0
    return min(255, sets * t.accumulators + fragments + in_flight + 40)


def blocks_per_sm(t: Tiling, maths: str) -> int:
    regs = -(-estimate_registers(t, maths) // 8) * 8
    by_regs = REGISTERS // (regs * t.threads)
    by_smem = H100.limits.shared_per_sm // (smem_bytes(t, maths)
                                            + H100.limits.reserved_shared_per_block)
    return max(1, min(by_regs, by_smem, 64 // (t.threads // 32)))


def estimate(shape: ConvShape, t: Tiling, maths: str) -> float:
    """Modelled time in microseconds, for ranking tilings.

    A block's K-tile costs the largest of its MMA, shared-memory, L2 and issue cycles, plus a
    barrier; its loads, issued stages-1 K-tiles ahead (1 for fp16/bf16), must also cover
    LOAD_LATENCY, shared among the blocks resident on the SM. The busiest SM runs
    ceil(tiles/SMS) blocks, each also paying an unhidden pipeline fill and its epilogue. The
    result is at least the DRAM floor; split-K adds its partial tiles' traffic.
    """
    half = maths in HALF_MATHS
    e = element_bytes(maths)
    warps = t.threads // 32
    mf, nf = t.wm // 16, t.wn // 8
    steps = t.bk // k_step(maths)  # MMA k-steps per K-tile
    mult = 3 if maths == "3xtf32" else 1
    mma = warps * mf * nf * steps * mult
    smem_read = warps * steps * (mf * 512 * a_parts(maths) + nf * 256)
    smem_write = t.bm * t.bk * e * a_parts(maths) + t.bn * t.bk * e
    # A comes from L2 every K-tile; most of B's gather hits L1 (each input feeds K*K taps).
    l2 = t.bm * t.bk * e * a_parts(maths) + t.bn * t.bk * e / 3
    frag_loads = mf * a_parts(maths) + (nf // 2 if half else 2 * nf)
    converts = {"tf32": 2 * nf, "3xtf32": 6 * nf + mf * nf * 4 / steps}.get(maths, 0)
    per_element = 2.5 if half else 1.2
    if t.gather == "table":
        per_element += 8.0
    gather = warps * (t.rows_per_thread * (t.bn // t.column_threads) * per_element + 12)
    issue = warps * steps * (mf * nf * mult + frag_loads + converts) + gather
    k_tile = max(mma / MMA_PER_CYCLE, (smem_read + smem_write) / SMEM_BYTES_PER_CYCLE,
                 l2 / L2_BYTES_PER_CYCLE, issue / ISSUE_PER_CYCLE) / SUSTAINED + BARRIER_CYCLES
    per_sm = -(-output_tiles(shape, t) * t.split_k // SMS)
    resident = min(blocks_per_sm(t, maths), per_sm)
    ahead = 1 if half else t.stages - 1
    k_tile = max(k_tile, LOAD_LATENCY / (ahead * resident))
    k_count = k_tiles(shape, t) / t.split_k
    epilogue = 2 * t.bm * t.bn * 4 / SMEM_BYTES_PER_CYCLE
    per_block = k_count * k_tile + (LOAD_LATENCY + epilogue) / resident
    total = max(per_sm * per_block, shape.min_bytes / DRAM_BYTES_PER_CYCLE)
    if t.split_k > 1:
        total += output_tiles(shape, t) * t.split_k * t.bm * t.bn * 8 / DRAM_BYTES_PER_CYCLE
    if estimate_registers(t, maths) >= 255:
        total *= 1.3  # likely spills
    return total / CLOCK_MHZ


WARP_GRIDS = ((2, 2), (1, 4), (4, 1), (2, 4), (4, 2), (1, 8), (8, 1))


def candidates(shape: ConvShape, maths: str) -> list[Tiling]:
    """Every valid tiling with warp tiles of at least 32x32 (or 16x64), M-padding within 15% of
    the least, and split-K only where the output tiles cannot fill two waves."""
    waste = {bm: blocks(shape.Mg, bm) * bm for bm in (32, 64, 96, 128, 192, 256)}
    least = min(waste.values())
    bms = [bm for bm, padded in waste.items() if padded <= 1.15 * least]
    stage_options = (2,) if maths in HALF_MATHS else (2, 3, 4)
    found = []
    for (gather, bk), bm, bn, (wgm, wgn), stages in itertools.product(
            gather_options(shape, maths), bms, (32, 64, 128, 256), WARP_GRIDS, stage_options):
        base = Tiling(bm, bn, bk, wgm, wgn, stages, 1, gather)
        if tiling_problem(base, maths) or base.accumulators < 32:
            continue
        splits = [1]
        if output_tiles(shape, base) < 2 * SMS:
            splits += [s for s in (2, 4, 8) if k_tiles(shape, base) >= 4 * s]
        for s in splits:
            t = Tiling(bm, bn, bk, wgm, wgn, stages, s, gather)
            if not shape_problem(shape, t):
                found.append(t)
    return found


@lru_cache(maxsize=256)
def ranked(shape: ConvShape, maths: str) -> tuple[Tiling, ...]:
    """Candidates by modelled time; ties go to squarer warp tiles (fewer fragment loads per
    MMA), then to more stages (slack for load latency the model does not see)."""
    def key(t):
        return (round(estimate(shape, t, maths), 2), abs(math.log2(t.wm / t.wn)), -t.stages,
                t.brief())
    return tuple(sorted(candidates(shape, maths), key=key))


def diverse(tilings: tuple[Tiling, ...], count: int, per_block_tile: int = 2) -> list[Tiling]:
    """The first `count` of `tilings`, at most `per_block_tile` of each block tile and split,
    so a short list still spans the space."""
    seen: dict[tuple, int] = {}
    chosen = []
    for t in tilings:
        key = (t.bm, t.bn, t.bk, t.gather, t.split_k)
        if seen.get(key, 0) < per_block_tile:
            seen[key] = seen.get(key, 0) + 1
            chosen.append(t)
            if len(chosen) == count:
                break
    return chosen


# --- staging fp16 / bf16 inputs (outside the timed region) -------------------------------------

@lru_cache(maxsize=1)
def _bf16_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "float32 x", "uint16 y",
        "unsigned int u = __float_as_uint(x);"
        " y = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);",
        "convlab_float_to_bf16")


def stage_fp16(x):
    import cupy

    return cupy.ascontiguousarray(x).astype(cupy.float16)


def stage_bf16(x):
    import cupy

    return _bf16_kernel()(cupy.ascontiguousarray(x, dtype=cupy.float32))


# --- the variants -------------------------------------------------------------------------------

class Pipelined(Variant):
    name = "pipelined"
    summary = "cp.async-pipelined implicit GEMM, mma.sync TF32, tuned tiles, split-K"
    precision = "tf32"
    maths = "tf32"
    source = SOURCE
    general = frozenset(FEATURES)
    epilogues = (RELU,)

    config_type = Tiling

    def __init__(self, config: Tiling | dict | None = None):
        """Without a config, each shape gets the cost model's first choice (`estimate`)."""
        self.tiling = None
        if config is not None:
            tiling = Tiling.of(config)
            problem = tiling_problem(tiling, self.maths)
            if problem:
                raise ValueError(f"invalid {self.name} config {tiling.as_dict()}: {problem}")
            self.tiling = tiling

    def fixed_config(self):
        return {} if self.tiling is None else self.tiling.as_dict()

    def default_config(self, shape, epilogue=None):
        best = ranked(shape, self.maths)
        return best[0] if best else None

    def accepts(self, config, shape, epilogue=None):
        return not tiling_problem(config, self.maths) and not shape_problem(shape, config)

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        t = self.config_for(shape)
        if t is None:  # no candidate fits: say why the smallest one does not
            smallest = Tiling(32, 32, k_step(self.maths), 1, 4, 2, 1, "table")
            return Support(False, f"no tiling fits: {shape_problem(shape, smallest)}")
        problem = shape_problem(shape, t)
        return Support(False, problem) if problem else Support(True)

    def configs(self, shape, epilogue=None):
        return diverse(ranked(shape, self.maths), MAX_CONFIGS)

    def configured(self, config):
        return type(self)(config)

    def defines(self, shape, epilogue=None):
        t = self.config_for(shape, epilogue)
        if t is None:
            raise ConvlabError(f"'{self.name}': {self.supports(shape).reason}")
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
                "STRIDE": shape.stride, "PAD": shape.pad, "G": shape.groups,
                "HAS_BIAS": int(shape.bias), "RELU": int(epilogue == RELU),
                "MODE": MODES[self.maths], "BM": t.bm, "BN": t.bn, "BK": t.bk,
                "WARPS_M": t.warps_m, "WARPS_N": t.warps_n, "STAGES": t.stages,
                "SPLIT_K": t.split_k, "GATHER_TAP": int(t.gather == "tap")}

    def input_dtype(self):
        return np.float32

    def stage_function(self):
        return None

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        support = self.supports(shape)
        if not support:
            raise ConvlabError(f"'{self.name}' cannot run {shape.describe()}: {support.reason}")
        import cupy

        t = self.config_for(shape, epilogue)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        smem = smem_bytes(t, self.maths)
        kernel.max_dynamic_shared_size_bytes = smem
        wpack = cupy.asarray(pack_weights(weights, shape, t, self.maths))
        table = cupy.asarray(gather_table(shape, t) if t.gather == "table"
                             else np.zeros((1, 4), dtype=np.int32))
        bias_d = device_weights(bias) if bias is not None else cupy.zeros(1, dtype=cupy.float32)
        tiles = output_tiles(shape, t)
        if t.split_k > 1:
            ws = cupy.empty(tiles * t.split_k * t.bm * t.bn, dtype=cupy.float32)
            counters = cupy.zeros(tiles, dtype=cupy.int32)
        else:
            ws = cupy.zeros(1, dtype=cupy.float32)
            counters = cupy.zeros(1, dtype=cupy.int32)
        grid = (m_tiles(shape, t) * n_tiles(shape, t) * t.split_k, shape.groups, 1)
        block = (t.threads, 1, 1)
        batch = np.int32(shape.B)
        dtype = np.dtype(self.input_dtype())
        name = self.name

        def launch(x, y):
            if x.dtype != dtype:
                raise ConvlabError(f"'{name}' reads {dtype} input, got {x.dtype}: pass op.stage(x)")
            kernel(grid, block, (x, wpack, table, bias_d, y, ws, counters, batch), shared_mem=smem)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue, self.stage_function())


class Pipelined3xTF32(Pipelined):
    name = "pipelined-3xtf32"
    summary = "pipelined with split TF32 operands (3 MMAs per step): FP32-level accuracy"
    precision = "fp32"
    maths = "3xtf32"

    def arithmetic(self, shape):
        return split_tf32_arithmetic(shape)


class PipelinedFP16(Pipelined):
    name = "pipelined-fp16"
    summary = "pipelined on fp16 inputs and filters (m16n8k16, ldmatrix), FP32 accumulation"
    precision = "fp16"
    maths = "fp16"

    def input_dtype(self):
        return np.float16

    def stage_function(self):
        return stage_fp16


class PipelinedBF16(PipelinedFP16):
    name = "pipelined-bf16"
    summary = "pipelined on bf16 inputs and filters (m16n8k16, ldmatrix), FP32 accumulation"
    precision = "bf16"
    maths = "bf16"

    def input_dtype(self):
        return np.uint16  # bf16 bit patterns: neither NumPy nor CuPy has a bfloat16 dtype

    def stage_function(self):
        return stage_bf16
