"""The implicit GEMM's mainloop pieces: the tile geometry as macros, the PTX it issues
(cp.async, mma.sync, ldmatrix), the grid schedule's kernel template (with a slot the family's
pieces fill: `filled`), the kernel's entry, which runs a schedule's template, the A operand's
copy, one K-tile's MMAs and the cp.async pipeline over the K-tiles (STAGES deep; two stages
with B through registers for fp16/bf16 gathered from NCHW, whose 2-byte elements are below
cp.async's minimum)."""

GEOMETRY = r"""
#define HALF (MODE >= 2)
#define ELEM_BYTES (HALF ? 2 : 4)
// fp16 / bf16 bits (staged outside the timed region), or float32.
template <int Bytes> struct StagedBits { typedef float type; };
template <> struct StagedBits<2> { typedef unsigned short type; };
typedef StagedBits<ELEM_BYTES>::type elem_t;
#define CG (C / G)
#define MG (M / G)
// A KH x KW filter whose taps lie DIL pixels apart, the input padded by PAD_H rows above and
// below and PAD_W columns left and right.
#define HO ((H + 2 * PAD_H - DIL * (KH - 1) - 1) / STRIDE + 1)
#define WO ((W + 2 * PAD_W - DIL * (KW - 1) - 1) / STRIDE + 1)
#define HWI (H * W)
#define HWO (HO * WO)
#define KK (KH * KW)
#define NWARPS (WARPS_M * WARPS_N)
#define THREADS (32 * NWARPS)
// PERSISTENT (wgmma): THREADS multiply, a warpgroup more copies; otherwise every thread does both.
#define LOADERS (PERSISTENT ? 128 : THREADS)
// PINGPONG (wgmma): the MMA warpgroups take turns on tiles of their own, so a warp's share of a
// tile is that of one warpgroup's four warps.
#define WM (BM * (1 + PINGPONG) / WARPS_M)
#define WN (BN / WARPS_N)
#define MF (WM / 16)
#define NF (WN / 8)
#define KSTEP (HALF ? 16 : 8)
#define KSTEPS (BK / KSTEP)
#define MTILES ((MG + BM - 1) / BM)
#define CCHUNKS ((CG + BK - 1) / BK)
#define KTILES (GATHER_TAP ? CCHUNKS * KK : (CG * KK + BK - 1) / BK)
// A stage holds A's 3xTF32 parts, big then small.
#define A_PARTS (MODE == 1 ? 2 : 1)
#define A_WORDS (BM * BK * A_PARTS * ELEM_BYTES / 4)
#define A_VECS (A_WORDS / 4)
// FILTERS_ONCE (wgmma's warp-specialised schedules, 3xTF32): the pack holds each filter once,
// as float32, and the MMA threads split their A fragments in registers (split_a_products):
// held split, the fp32 class holds its filters twice, ResNet-50's 97 MiB of them as 195. The
// grid schedule and the mma fragment packs hold both parts. A_COPY_VECS: the vectors of a
// K-tile in the pack, which a copy moves.
#define A_SPLIT_ON_CHIP (SWIZZLE && PERSISTENT && MODE == 1 && FILTERS_ONCE)
#define A_PACK_PARTS (A_SPLIT_ON_CHIP ? 1 : A_PARTS)
#define A_COPY_VECS (A_VECS / A_PARTS * A_PACK_PARTS)
// wgmma's packs (SWIZZLE) hold a group's last m-tile with only the rows it has, in whole 8-row
// swizzle atoms (igemm.packing.trim_last_tiles), so output channels past a whole tile cost no
// padded filters: the last FC layer's 1,000 rows would otherwise be 1,024. It comes first in
// its group, its K-tiles A_LAST_VECS apart, and a copy of one still moves A_COPY_VECS: the
// rows past A_LAST_ROWS are the next K-tile's (or the next m-tile's, or a zero tail where the
// group has one m-tile), and they meet only output rows past MG, which no epilogue stores.
// Where 3xTF32's two parts lie side by side in a K-tile (the grid schedule) they keep the
// padding, and so do the mma fragment packs: trimmed, the shipped channels-last tiling of a
// 1,000-row FC layer ran 3.7% slower.
#define A_LAST_ROWS (SWIZZLE && A_PACK_PARTS == 1 ? (MG - (MTILES - 1) * BM + 7) / 8 * 8 : BM)
#define A_LAST_VECS (A_COPY_VECS / BM * A_LAST_ROWS)
// One (group, m-tile)'s run of packed K-tiles: where K-tile kt starts. Constructed from the pair,
// or from the halo walk's one index for it, group * MTILES + mtile. A type per case, not a
// `static constexpr` switch (NVRTC gave the member a constant section) nor a step the loaders'
// lambdas capture: either changed the machine code of builds with whole tiles.
template <bool Trimmed> struct FilterTileRun;
template <> struct FilterTileRun<false> {
    const float4* base;
    __device__ __forceinline__ FilterTileRun(const float4* wpack, int group, int mtile)
        : base(wpack + (long long)(group * MTILES + mtile) * KTILES * A_COPY_VECS) {}
    __device__ __forceinline__ FilterTileRun(const float4* wpack, int filters)
        : base(wpack + (long long)filters * KTILES * A_COPY_VECS) {}
    __device__ __forceinline__ const float4* tile(int kt) const {
        return base + (long long)kt * A_COPY_VECS;
    }
};
template <> struct FilterTileRun<true> {
    const float4* base;
    long long step;
    __device__ __forceinline__ FilterTileRun(const float4* wpack, int group, int mtile)
        : base(wpack + (long long)group * ((MTILES - 1) * A_COPY_VECS + A_LAST_VECS) * KTILES
               + (mtile == MTILES - 1
                      ? 0 : (long long)(A_LAST_VECS + mtile * A_COPY_VECS) * KTILES)),
          step(mtile == MTILES - 1 ? A_LAST_VECS : A_COPY_VECS) {}
    __device__ __forceinline__ FilterTileRun(const float4* wpack, int filters)
        : FilterTileRun(wpack, filters / MTILES, filters % MTILES) {}
    __device__ __forceinline__ const float4* tile(int kt) const { return base + kt * step; }
};
using FilterTiles = FilterTileRun<(A_LAST_ROWS < BM)>;
// NHWC: B tile stored [n][k]: each pixel's BK channels of a K-tile side by side, copied VEC
// elements (16 bytes where the channels allow) at a time. Rows padded by 16 bytes: the 8 rows of
// an ldmatrix (or the 8 pixels of a TF32 fragment read) start in 8 different 16-byte bank
// groups. SWIZZLE (wgmma's operands): rows of exactly 128 bytes, 16-byte chunk c of row n stored
// at chunk c ^ (n % 8), the layout a 128-byte-swizzle descriptor reads, conflict-free unpadded.
// NCHW: B stored [k][n], its rows padded by 8 elements.
#define B_LD (NHWC ? (SWIZZLE ? BK : BK + 16 / ELEM_BYTES) : BN + 8)
#define B_VEC_OFFSET(n, kc) \
    (SWIZZLE ? (n) * BK * ELEM_BYTES + (((kc) * VEC * ELEM_BYTES) ^ (((n) & 7) << 4)) \
             : ((n) * B_LD + (kc) * VEC) * ELEM_BYTES)
#define B_WORDS ((NHWC ? BN : BK) * B_LD * ELEM_BYTES / 4)
// NHWC: a loading thread copies vector KC of BN_ROWS pixel rows, BN / BN_ROWS apart.
#define KCHUNKS (BK / VEC)
#define ROW_STEP (LOADERS / KCHUNKS)
#define BN_ROWS (BN / ROW_STEP)
// NCHW: COLT threads side by side along the tile's pixels, each owning NCOLS pixel columns and
// RPT consecutive k rows of every K-tile.
#define COLT (THREADS < BN ? THREADS : BN)
#define NCOLS (BN / COLT)
#define RPT (BK * COLT / THREADS)
// fp16/bf16 elements are below cp.async's 4-byte minimum: NCHW's B passes through registers.
#define B_IN_REGISTERS (NHWC ? 0 : HALF)
// The epilogue stages C transposed ([n][m], NHWC: stores then run along the output channels)
// or as it is ([m][n], NCHW).
#define C_LD (NHWC ? BM + 4 : BN + 8)
// wgmma reads both operands from shared memory, so 3xTF32 there keeps B's small part beside
// its big one (mma.sync splits B in registers).
#define B_PARTS (SWIZZLE && MODE == 1 ? 2 : 1)
#define STAGE_WORDS (A_WORDS + B_PARTS * B_WORDS)
"""

def filled(frame: str, **slots: str) -> str:
    """`frame` with each slot's `$NAME` line replaced by its pieces: statements whole, so each
    piece's braces close within it and the frame's within the frame."""
    for name, pieces in slots.items():
        if f"${name}\n" not in frame:
            raise ValueError(f"the frame has no slot {name}")
        frame = frame.replace(f"${name}\n", pieces)
    return frame


INSTRUCTIONS = r"""
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

// Bytes (4, 8 or 16: VEC elements); src-size 0 zero-fills them (padding taps, channels past the
// group's). Only 16-byte copies may bypass L1 (.cg); the input is reused across taps anyway.
template <int Bytes>
__device__ __forceinline__ void cp_async_vec(unsigned dst, const void* src, bool ok)
{
    if constexpr (Bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(dst), "l"(src), "r"(ok ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                     :: "r"(dst), "l"(src), "n"(Bytes), "r"(ok ? Bytes : 0));
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

// In fp16 (MODE 2) or bf16.
__device__ __forceinline__ void mma_16(float (&d)[4], const uint4& a, const unsigned (&b)[2])
{
    if constexpr (MODE == 2)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b[0]), "r"(b[1]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 b16 matrices: from B stored [n][k], lane (g, t) receives (n g; k 2t, 2t+1) of each.
__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2,
                                            unsigned& r3, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// Four 8x8 b16 matrices, transposed: from B stored [k][n], lane (g, t) receives (k 2t, 2t+1; n g)
// of each, exactly the m16n8k16 B fragment register.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2,
                                                  unsigned& r3, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
"""

# A schedule's kernel is a class template (GRID_KERNEL below; igemm.persistent's and
# igemm.halo's) over the pieces that differ between its builds (its tile walk; the persistent
# kernel's gather too; the halo's rows): its `run` is the kernel's body, the schedule's BODY
# slot filled by the family's pieces, and its enumerators `threads` and `min_blocks` the launch
# bounds. ENTRY is the one __global__ function: it runs the schedule
# as the family's source instantiates it, TilingKernel, passing its parameters on as they came
# (a persistent kernel's im2col map last). A template's constants are enumerators, not static
# constexpr members: NVRTC gives those storage in global memory, which changed every cubin.
RUN_PARAMETERS = r"""
        const elem_t* __restrict__ x, const float4* __restrict__ wpack,
        const int4* __restrict__ table, const float* __restrict__ bias, out_t* __restrict__ y,
        float* __restrict__ ws, int* __restrict__ counters, int batch,
        const kept_t* __restrict__ kept"""

# The grid schedule: a block per unit of work (igemm.tile_walks' Walk: a tile, or a K-split of
# one), every thread copying and multiplying; its BODY is the family's gather, mainloop and
# epilogue.
GRID_KERNEL = r"""
// wpack: the filters as A fragments, [G][MTILES][KTILES][A_PARTS][BM/16][KSTEPS][32 lanes][16 B]
// (host-packed, zero-padded); table: per k {offset c*H*W+p*W+q, p, q, 0} when !GATHER_TAP;
// ws, counters: split-K partial tiles and arrival counts (all counts zero between launches);
// kept: the residual block's kept activation the add-relu epilogue adds (igemm.epilogue).
template <class Walk>
struct GridKernel {
    enum : int { threads = THREADS, min_blocks = 0 };  // 0: no bound on blocks per SM
    static __device__ __forceinline__ void run(""" + RUN_PARAMETERS + r""");
};

template <class Walk>
__device__ __forceinline__ void GridKernel<Walk>::run(""" + RUN_PARAMETERS + r""")
{
    extern __shared__ __align__(16) float smem_raw[];
    // Swizzled tiles must start on 1024-byte boundaries (the host asks for 1 KB more).
    float* const smem =
        SWIZZLE ? smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u) / 4 : smem_raw;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const TileUnit unit = Walk::unit();
    const int npix = batch * HWO;  // < 2^31, checked by the host
$BODY
}
"""

# The warp-specialised schedules' shared memory starts on 1 KB, for the swizzle.
WARP_SPECIALISED_SMEM = r"""
    extern __shared__ __align__(16) float smem_raw[];
    float* const smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u) / 4;
"""

ENTRY = r"""
// The kernel: it runs TilingKernel, the tiling's schedule with its pieces. Its switches are the
// few a template cannot carry: a cluster's launch attribute, and the copy engine's tensor map,
// a parameter passed by value.
extern "C" __global__ void __launch_bounds__(TilingKernel::threads, TilingKernel::min_blocks)
#if CLUSTER > 1
__cluster_dims__(CLUSTER, 1, 1)
#endif
conv_forward(const elem_t* __restrict__ x, const float4* __restrict__ wpack,
             const int4* __restrict__ table, const float* __restrict__ bias,
             out_t* __restrict__ y, float* __restrict__ ws, int* __restrict__ counters, int batch
#if GATHER_TMA
             , const __grid_constant__ TensorMap im2col_map
#endif
             , const kept_t* __restrict__ kept)
{
    TilingKernel::run(x, wpack, table, bias, y, ws, counters, batch, kept
#if GATHER_TMA
                      , &im2col_map
#endif
    );
}
"""

# The kernel of a family with the grid schedule alone.
GRID_ENTRY = "\nusing TilingKernel = GridKernel<GridWalk<SPLIT_K, MTILES, KTILES>>;\n" + ENTRY

LOAD_A = r"""
    const FilterTiles wtiles(wpack, unit.group, unit.mtile);
    auto load_a = [&](int stage, int kt) {
        float* sa = smem + stage * STAGE_WORDS;
        const float4* src = wtiles.tile(kt);
#pragma unroll
        for (int v = 0; v < (A_VECS + THREADS - 1) / THREADS; ++v) {
            const int idx = tid + v * THREADS;
            if (A_VECS % THREADS == 0 || idx < A_VECS)
                cp_async16(smem_u32(sa + idx * 4), src + idx);
        }
    };
"""

COMPUTE = r"""
    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    auto compute = [&](int stage) {
        const float* sa = smem + stage * STAGE_WORDS;
        if constexpr (HALF) {
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
                    if constexpr (NHWC) {
                        // lanes 0-7: pixels of n-tile j at k 0-7, 8-15: at k 8-15; 16-31: n-tile j+1
                        const int n = wn * WN + (j + (lane >> 4)) * 8 + (lane & 7);
                        const int k = s * 16 + ((lane >> 3) & 1) * 8;
                        ldmatrix_x4(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                                    sb + (n * B_LD + k) * 2);
                    } else {
                        // lanes 0-7: k 0-7 of n-tile j, 8-15: k 8-15, 16-23 / 24-31: the same for j+1
                        const int row = s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                        const int col = wn * WN + (j + (lane >> 4)) * 8;
                        ldmatrix_x4_trans(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                                          sb + (row * B_LD + col) * 2);
                    }
                }
#pragma unroll
                for (int i = 0; i < MF; ++i)
#pragma unroll
                    for (int j = 0; j < NF; ++j) mma_16(acc[i][j], a[i], b[j]);
            }
        } else {
            const float4* sa4 = reinterpret_cast<const float4*>(sa);
            const float* sb = sa + A_WORDS;
            // 3xTF32 (MODE 1): this K-tile's products go to a fresh accumulator, added to the
            // running sum with an FP32 add (round to nearest): the tensor cores' truncating
            // accumulation then acts on 3*BK/8 additions of one tile's size, not on the whole
            // reduction. Its small parts (al, bl) exist in that mode only.
            float part[MODE == 1 ? MF : 1][NF][4];
            if constexpr (MODE == 1) {
#pragma unroll
                for (int i = 0; i < MF; ++i)
#pragma unroll
                    for (int j = 0; j < NF; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
            }
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                unsigned a[MF][4], b[NF][2];
#pragma unroll
                for (int i = 0; i < MF; ++i) {
                    const float4 v = sa4[((wm * MF + i) * KSTEPS + s) * 32 + lane];
                    a[i][0] = __float_as_uint(v.x); a[i][1] = __float_as_uint(v.y);
                    a[i][2] = __float_as_uint(v.z); a[i][3] = __float_as_uint(v.w);
                }
                unsigned al[MODE == 1 ? MF : 1][4], bl[MODE == 1 ? NF : 1][2];
                if constexpr (MODE == 1) {
#pragma unroll
                    for (int i = 0; i < MF; ++i) {
                        const float4 v = sa4[BM * BK / 4 + ((wm * MF + i) * KSTEPS + s) * 32 + lane];
                        al[i][0] = __float_as_uint(v.x); al[i][1] = __float_as_uint(v.y);
                        al[i][2] = __float_as_uint(v.z); al[i][3] = __float_as_uint(v.w);
                    }
                }
#pragma unroll
                for (int j = 0; j < NF; ++j) {
                    // NHWC: B is [n][k]; NCHW: [k][n]
                    const float* bp = NHWC ? sb + (wn * WN + j * 8 + g8) * B_LD + s * 8 + t4
                                           : sb + (s * 8 + t4) * B_LD + wn * WN + j * 8 + g8;
                    const float f0 = bp[0], f1 = bp[NHWC ? 4 : 4 * B_LD];
                    b[j][0] = to_tf32(f0);
                    b[j][1] = to_tf32(f1);
                    if constexpr (MODE == 1) {
                        bl[j][0] = to_tf32(f0 - __uint_as_float(b[j][0]));
                        bl[j][1] = to_tf32(f1 - __uint_as_float(b[j][1]));
                    }
                }
#pragma unroll
                for (int i = 0; i < MF; ++i)
#pragma unroll
                    for (int j = 0; j < NF; ++j) {
                        if constexpr (MODE == 1) {
                            mma_tf32(part[i][j], al[i], b[j]);
                            mma_tf32(part[i][j], a[i], bl[j]);
                            mma_tf32(part[i][j], a[i], b[j]);
                        } else {
                            mma_tf32(acc[i][j], a[i], b[j]);
                        }
                    }
            }
            if constexpr (MODE == 1) {
#pragma unroll
                for (int i = 0; i < MF; ++i)
#pragma unroll
                    for (int j = 0; j < NF; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
            }
        }
    };
"""

PIPELINE = r"""
    // The unit's K range (unit.kbeg, unit.kend), reckoned here from the block's index: read from
    // the unit, NVRTC built other split-K code, 3.3% slower on the shipped channels-last FC
    // tiling (H200, 2026-11-29, results/h200/tile-walks-20261129/).
    const int split = blockIdx.x % SPLIT_K;
    const int kbeg = (int)((long long)split * KTILES / SPLIT_K);
    const int nk = (int)((long long)(split + 1) * KTILES / SPLIT_K) - kbeg;
#if B_IN_REGISTERS
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
"""
