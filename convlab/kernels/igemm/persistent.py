"""The wgmma kernel's persistent, warp-specialised schedule (Tiling.schedule "persistent"): a
block per SM slot walks the output tiles (each tile's K-splits, where it splits K); one
warpgroup copies, the others multiply, and the stages pass between them on mbarriers. Its
pingpong form (Tiling.schedule "pingpong") gives each of two MMA warpgroups a tile of its own,
in turn. Same gather, swizzled layout, MMAs and epilogue maths as the grid schedule beside it
(igemm.wgmma); or, with the "tma" gather, one loader thread has the copy engine bring both
operands (B through an im2col tensor map, gpu.tensormap).

setmaxnreg moves registers from the loaders to the MMA warps where those need more than the
launch's cap: without it such tilings ran 5-16% slower on an H100 (2026-11-25). It cannot make
room for one wgmma's accumulators beyond that cap (ptxas stops with C7602), so the host picks
blocks per SM for those to fit (igemm.wgmma.blocks_per_sm)."""

from . import gather_nhwc, mainloop, wgmma

INSTRUCTIONS = r"""
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n"
                 :: "r"(bar) : "memory");
}

// One arrival that also announces `bytes` the copy engine will deliver (complete_tx).
__device__ __forceinline__ void mbar_arrive_expect(unsigned bar, unsigned bytes)
{
    asm volatile("{\n.reg .b64 state;\n"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}

// Until the barrier's phase of this parity has completed (a fresh barrier counts its phase
// "-1", parity 1, as completed: the loaders' first pass over the stages does not wait).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// The copy engine (TMA's 1-D form): `bytes` contiguous bytes, completing on the barrier.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// An arrival on the barrier at the same shared-memory offset in every block of the cluster: a
// stage of the "tma" gather's two-block clusters is written by both blocks' copies (the first
// block's B copy lands in both), so each block's loader waits for both blocks' MMA threads.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar)
{
#pragma unroll
    for (unsigned rank = 0; rank < CLUSTER; ++rank) {
        unsigned remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
    }
}

// Every thread of the cluster: after it, the other block's barriers are initialised (at the
// start) or no longer read from this block (at the end, before either block may exit).
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// The copy engine's descriptor of the input (gpu.tensormap encodes it on the host), passed by
// value: a launch's parameters are constant, so the copies read it without a fence.
struct __align__(64) TensorMap { unsigned long long bytes[16]; };

// B by the copy engine's im2col mode: from the map's NHWC input, BK channels of each of BN
// output pixels in a row, starting at pixel (w, h, n) -- its window's top-left corner -- and
// walking w, then h, then the image, as the output pixels run; each read at the tap's offset
// (q, p), zeros outside the image and past the last one. The map's 128-byte swizzle writes the
// box as the gather's cp.async did.
__device__ __forceinline__ void im2col_copy(unsigned dst, const TensorMap& map, int c, int w,
                                            int h, int n, int q, int p, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col"
                 ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n"
                 :: "r"(dst), "l"(&map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar),
                    "h"((unsigned short)q), "h"((unsigned short)p) : "memory");
}

// im2col_copy into every block of the cluster, at the same offsets, each completing on its own
// block's barrier there.
__device__ __forceinline__ void im2col_copy_multicast(unsigned dst, const TensorMap& map, int c,
                                                      int w, int h, int n, int q, int p,
                                                      unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col"
                 ".mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8}, %9;\n"
                 :: "r"(dst), "l"(&map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar),
                    "h"((unsigned short)q), "h"((unsigned short)p),
                    "h"((unsigned short)((1u << CLUSTER) - 1)) : "memory");
}

// The register store's 16-byte path (igemm.epilogue) in the persistent schedule: fp16 or bf16
// output of fp16 or bf16 maths whose groups' channels start on 16 bytes; float32 output of an
// add-relu epilogue (not 3xTF32's, whose two accumulator sets leave no registers for the kept
// read-ahead) whose groups' channels start on 16 bytes. Each warp turns its fragments around
// in STORE_SCRATCH bytes of shared memory after the barriers (the host's count, defined by it).
#define VECTOR_STORE (MODE != 1 && !HALO && (OUT_HALF ? MODE >= 2 && M % 8 == 0 && MG % 8 == 0 \
                                                    : ADD_KEPT && M % 4 == 0 && MG % 4 == 0))

// Two outputs as the 32 bits of a 16-bit pair, the first in the low half (the lower address).
__device__ __forceinline__ unsigned half_pair(float lo, float hi)
{
    return (unsigned)to_out(lo) | ((unsigned)to_out(hi) << 16);
}

// The kept activation's elements a lane adds to its 16-byte output vector, as loaded: eight for
// eight 16-bit outputs (`Eight`, EIGHT_AHEAD of them in flight in the stores' loop,
// igemm.epilogue), four for four float32 ones (`Four`, 8 bytes when 16-bit; as many in flight
// as fill the same 128 bytes). Element: the kept type (gpu.elements).
template <class Element> struct KeptVectors {
    typedef uint4 Eight;
    typedef uint2 Four;
    enum { EIGHT_AHEAD = 8 };
    static __device__ __forceinline__ Eight load8(const unsigned short* __restrict__ kept)
    {
        return __ldg(reinterpret_cast<const uint4*>(kept));
    }
    static __device__ __forceinline__ void values8(const Eight& kv, float (&k)[8])
    {
        const unsigned kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) Element::unpack(kw[i], k[2 * i], k[2 * i + 1]);
    }
    static __device__ __forceinline__ float4 values4(const Four& k)
    {
        float4 v;
        Element::unpack(k.x, v.x, v.y);
        Element::unpack(k.y, v.z, v.w);
        return v;
    }
};

template <> struct KeptVectors<Float32Element> {
    struct Eight { float4 lo, hi; };
    typedef float4 Four;
    enum { EIGHT_AHEAD = 4 };
    static __device__ __forceinline__ Eight load8(const float* __restrict__ kept)
    {
        return {__ldg(reinterpret_cast<const float4*>(kept)),
                __ldg(reinterpret_cast<const float4*>(kept) + 1)};
    }
    static __device__ __forceinline__ void values8(const Eight& kv, float (&k)[8])
    {
        k[0] = kv.lo.x; k[1] = kv.lo.y; k[2] = kv.lo.z; k[3] = kv.lo.w;
        k[4] = kv.hi.x; k[5] = kv.hi.y; k[6] = kv.hi.z; k[7] = kv.hi.w;
    }
    static __device__ __forceinline__ float4 values4(const Four& k) { return k; }
};

typedef KeptVectors<KeptElement> Kept;
typedef Kept::Eight kept8_t;
typedef Kept::Four kept4_t;
#define KEPT_AHEAD Kept::EIGHT_AHEAD
#define KEPT_AHEAD4 (128 / (int)sizeof(kept4_t))

__device__ __forceinline__ kept8_t load_kept8(const kept_t* __restrict__ kept)
{
    return Kept::load8(kept);
}

// The eight 16-bit outputs of a 16-byte vector (the bias added, the ReLU not yet applied) plus
// the kept activation's eight elements there, through the ReLU: the add-relu epilogue's 16-byte
// path. The conv's sum is rounded to 16 bits before the add, an error within u of its terms'
// sum |x*w|, which the check's bound (8 sqrt(n) u of it) already allows.
__device__ __forceinline__ uint4 add_kept8(uint4 v, const kept8_t& kv)
{
    float k[8];
    Kept::values8(kv, k);
    unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float lo, hi;
        HalfElement::unpack(w[i], lo, hi);
        w[i] = half_pair(finish_value(lo + k[2 * i], 0.0f), finish_value(hi + k[2 * i + 1], 0.0f));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ kept4_t load_kept4(const kept_t* __restrict__ kept)
{
    return __ldg(reinterpret_cast<const kept4_t*>(kept));
}

__device__ __forceinline__ float4 kept4_values(const kept4_t& k)
{
    return Kept::values4(k);
}

__device__ __forceinline__ void store_shared_float(unsigned p, float v)
{
    asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(p), "f"(v) : "memory");
}

// Four 8x8 fp16 matrices from the warp's fragments to shared memory, each transposed: lanes
// 8i..8i+7 name the rows of matrix i.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned row, const unsigned (&v)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(row), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}

__device__ __forceinline__ uint4 load_shared16(unsigned p)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store16(out_t* p, uint4 v)
{
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
"""

# The "tma" gather as a type: the copy engine's im2col box of a unit's tile at each K-tile.
IM2COL_GATHER = r"""
struct Im2colGather {
    enum : bool { copy_engine = true };  // one thread has the copy engine copy
    int image, w0, h0, channels;  // the tile's first pixel's window corner, its group's channels

    // The tile's first pixel, as NhwcGather::start finds it.
    __device__ __forceinline__ explicit Im2colGather(const TileUnit& unit)
    {
        const int n0 = unit.ntile * BN, b = n0 / HWO, r = n0 - b * HWO;
        const int ho = r / WO, wo = r - ho * WO;
        image = b;
        w0 = wo * STRIDE - PAD_W;
        h0 = ho * STRIDE - PAD_H;
        channels = unit.group * CG;
    }

    // K-tile kt's box into the B tile at shared address `tile`, completing on `bar`: in a
    // cluster, into every block's stage (the caller's block is the one that copies B).
    __device__ __forceinline__ void load(unsigned tile, const TensorMap& map, int kt,
                                         unsigned bar) const
    {
        const int cc = kt / KK, tap = kt - cc * KK, p = tap / KW;
        if constexpr (CLUSTER > 1)
            im2col_copy_multicast(tile, map, channels + cc * BK, w0, h0, image,
                                  (tap - p * KW) * DIL, p * DIL, bar);
        else
            im2col_copy(tile, map, channels + cc * BK, w0, h0, image, (tap - p * KW) * DIL,
                        p * DIL, bar);
    }
};
"""

# The kernel: the barriers and the list of units both roles walk, then the loader warpgroup's
# loop beside the MMA warpgroups' (ROLES). Each reads the grid schedule's pieces where they are
# the same (gather, B split, MMAs).
PROLOGUE = r"""
    // After the stages: STAGES "full" barriers (the loaders' copies and A's bulk copy landed;
    // with the copy engine's gather, both copies, counted in bytes behind one arrival) and
    // STAGES "empty" ones (every MMA thread is done reading the stage).
    const unsigned full0 = smem_u32(smem + STAGES * STAGE_WORDS);
    const unsigned empty0 = full0 + 8 * STAGES;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3;
    // The warp's 16 rows of its tile: under PINGPONG each warpgroup holds a whole tile.
    const int tile_warp = PINGPONG ? warp & 3 : warp;
    const int npix = batch * HWO;  // < 2^31, checked by the host
    const Walk walk(npix);
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            // each loader and A's expect_tx, or the copy engine's one expect_tx
            mbar_init(full0 + 8 * s, Gather::copy_engine ? 1 : LOADERS + 1);
            // a cluster's MMA warps arrive once a warp, on every block's barrier; under
            // PINGPONG one warpgroup reads a stage
            mbar_init(empty0 + 8 * s, CLUSTER > 1 ? CLUSTER * NWARPS : THREADS / (1 + PINGPONG));
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CLUSTER > 1)
        cluster_sync();
    else
        __syncthreads();
"""

ROLES = r"""
    if (warp >= NWARPS) {
$LOADER
    } else {
$CONSUMER
    }
    if constexpr (CLUSTER > 1) {
        __syncwarp();
        cluster_sync();
    }
"""

LOADER_BEGIN = r"""
        if constexpr (PRODUCER_REGS > 0) setmaxnreg_dec<PRODUCER_REGS>();
        // The loaders number themselves from 0, as NhwcGather(tid) expects (tid < LOADERS).
        const int tid = threadIdx.x - THREADS;
"""

LOADER_UNITS = r"""
        // K-tile j (counted over all of this block's units) goes to stage j % STAGES once the
        // MMA threads released that stage's previous use. Its B copies are published LAG
        // K-tiles later, when cp.async.wait_group says they landed: this thread fences them
        // for the async proxy that wgmma reads through (and splits them for 3xTF32) before
        // its arrival, so LAG + 1 K-tiles of copies stay in flight. A's tile comes by the copy
        // engine, counted by the barrier's transaction bytes. LAG is at most STAGES - 2: the
        // MMA threads free K-tile j's stage only after issuing j + 1, so a loader further
        // behind would wait for a stage that waits for its own publication.
        constexpr int LAG = STAGES - 2;
        Gather gather(tid);
        auto publish = [&](int p) {
            const int stage = p % STAGES;
            if constexpr (MODE == 1)
                split_b_tile<CROSS_BF16>(smem, stage, gather.row0, gather.kc);
            fence_proxy_async();
            mbar_arrive(full0 + 8 * stage);
        };
        int j = 0;
        for (int u = walk.first(); u < walk.units; u = walk.next(u)) {
            const TileUnit unit = walk.unit(u);
$BODY
        }
        cp_async_wait<0>();
        for (int p = j < LAG ? 0 : j - LAG; p < j; ++p) publish(p);
"""

GATHER_START = r"""
            gather.start(unit, npix);
"""

LOAD_A_BULK = r"""
            const FilterTiles wtiles(wpack, unit.group, unit.mtile);
            auto load_a = [&](int stage, int kt) {
                if (tid == 0) {
                    const unsigned bar = full0 + 8 * stage;
                    mbar_arrive_expect(bar, A_COPY_VECS * 16);
                    bulk_copy(smem_u32(smem + stage * STAGE_WORDS), wtiles.tile(kt),
                              A_COPY_VECS * 16, bar);
                }
            };
"""

LOADER_K_TILES = r"""
            for (int kt = unit.kbeg; kt < unit.kend; ++kt, ++j) {
                const int stage = j % STAGES;
                mbar_wait(empty0 + 8 * stage, ((j / STAGES) & 1) ^ 1);
                load_tile(stage, kt);
                cp_async_commit();
                if (j >= LAG) {
                    cp_async_wait<LAG>();
                    publish(j - LAG);
                }
            }
"""

# The loader of the "tma" gather: one thread, two copies a K-tile.
LOADER_TMA = r"""
        // Each K-tile is two copies, A's bulk one and B's im2col box, whose bytes the stage's
        // full barrier counts: no loader waits for its copies, fences or publishes them, so
        // every free stage has its copies in flight, and one thread issues them all. In a
        // cluster, the first block's B copy fills both blocks' stages (its empty barrier
        // counts both blocks' MMA warps), which halves B's reads from L2.
        const bool copies_b = CLUSTER == 1 || cluster_rank() == 0;
        if (tid == 0) {
            int j = 0;
            for (int u = walk.first(); u < walk.units; u = walk.next(u)) {
                const TileUnit unit = walk.unit(u);
                const FilterTiles wtiles(wpack, unit.group, unit.mtile);
                const Gather gather(unit);
                for (int kt = unit.kbeg; kt < unit.kend; ++kt, ++j) {
                    const int stage = j % STAGES;
                    mbar_wait(empty0 + 8 * stage, ((j / STAGES) & 1) ^ 1);
                    const unsigned bar = full0 + 8 * stage;
                    const unsigned sa = smem_u32(smem + stage * STAGE_WORDS);
                    mbar_arrive_expect(bar, A_COPY_VECS * 16 + B_WORDS * 4);
                    bulk_copy(sa, wtiles.tile(kt), A_COPY_VECS * 16, bar);
                    if (copies_b) gather.load(sa + A_WORDS * 4, *im2col_map, kt, bar);
                }
            }
        }
"""

CONSUMER_BEGIN = r"""
        if constexpr (CONSUMER_REGS > 0) setmaxnreg_inc<CONSUMER_REGS>();
"""

CONSUMER = r"""
        // Warpgroup w multiplies rows 64w.. of each tile (under PINGPONG, the whole of every
        // other tile); each K-tile's stage is released
        // once the wgmmas reading it have retired (one group stays in flight, so the release
        // of K-tile j follows the issue of j + 1), and the tile's sum goes straight from the
        // registers to the output while the loaders fill the stages for the next tile. A
        // K-split's partial sum goes to the workspace instead, and the tile's last split to
        // arrive adds them and stores (splitk.SPLIT_K_LAST). The loaders do not take part in
        // the MMA threads' barriers.
        __shared__ int split_arrivals;
        auto consumers_sync = [] { asm volatile("bar.sync 1, %0;\n" :: "n"(THREADS) : "memory"); };
        auto release = [&](int stage) {
            if constexpr (CLUSTER > 1) {
                __syncwarp();
                if (lane == 0) mbar_arrive_cluster(empty0 + 8 * stage);
            } else {
                mbar_arrive(empty0 + 8 * stage);
            }
        };
        // PINGPONG: the block's units go to its two warpgroups in turn, each tile 64 rows, so
        // one warpgroup's epilogue runs while the other's wgmmas keep the tensor cores busy
        // (CUTLASS's ping-pong kernel schedule). The loaders fill the stages in the units'
        // order, so a warpgroup steps j past the other's K-tiles, and its K-loop waits for the
        // other's to have issued (named barrier 2 + w: warpgroup w may start; CUTLASS's
        // ordered sequence barrier): a stage's full barrier is waited for by parity, which
        // cannot tell a phase from the one two phases on, so no warpgroup may run ahead to a
        // K-tile more than one pass of the stages beyond the last one waited for.
        auto wait_turn = [&] {
            asm volatile("bar.sync %0, %1;\n" :: "r"(2 + warp / 4), "n"(THREADS) : "memory");
        };
        auto pass_turn = [&] {
            asm volatile("bar.arrive %0, %1;\n" :: "r"(3 - warp / 4), "n"(THREADS) : "memory");
        };
        int j = 0, turn = 0;
        for (int u = walk.first(); u < walk.units; u = walk.next(u), ++turn) {
            const TileUnit unit = walk.unit(u);
            if (PINGPONG && (turn & 1) != warp / 4) {
                j += unit.kend - unit.kbeg;
                continue;
            }
            out_t* const ytile =
                y + (long long)unit.ntile * BN * M + unit.group * MG + unit.mtile * BM;
            const int tile_pixels = npix - unit.ntile * BN;
            auto pixel = [&](int q, unsigned& at) {
                at = q * M;
                return q < tile_pixels;
            };
            prefetch_kept_tile(unit, ytile, pixel, tile_warp, lane, y, kept);
#pragma unroll
            for (int f = 0; f < NF; ++f)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[0][f][e] = 0.0f;
            fence_operands(acc);
            if constexpr (PINGPONG) {
                if (turn > 0) wait_turn();
            }
            for (int kt = unit.kbeg; kt < unit.kend; ++kt, ++j) {
                const int stage = j % STAGES;
                mbar_wait(full0 + 8 * stage, (j / STAGES) & 1);
                if constexpr (MODE == 1) {
                    // a K-tile's products in a fresh partial sum (the grid schedule's span of
                    // them would hold the stage: igemm.wgmma.part_ktiles), added with FP32 adds
                    // once they retire
                    compute(stage, part);
                    wgmma_wait<0>();
                    fence_operands(part);
                    release(stage);
#pragma unroll
                    for (int f = 0; f < NF; ++f)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[0][f][e] += part[0][f][e];
                } else {
                    compute(stage, acc);
                    wgmma_wait<1>();
                    if (kt > unit.kbeg) release((j - 1) % STAGES);
                }
            }
            if constexpr (PINGPONG) {
                if (walk.next(u) < walk.units) pass_turn();
            }
            if constexpr (MODE != 1) {
                wgmma_wait<0>();
                release((j - 1) % STAGES);
            }
            fence_operands(acc);
            if constexpr (SPLIT_K > 1) {
                if (!split_k_last(&acc[0][0][0], ws, counters, walk.slot(unit), unit.split, tid,
                                  consumers_sync, &split_arrivals))
                    continue;
            }
            store_registers_nhwc(acc, unit, pixel, ytile, ytile + 16 * tile_warp + g8, tile_warp,
                                 warp, lane, g8, t4, empty0 + 8 * STAGES, y, bias, kept);
        }
"""

PARTIAL_SUM = r"""
        float part[MF][NF][4];  // 3xTF32's
        if constexpr (MODE == 1) {
#pragma unroll
            for (int f = 0; f < NF; ++f)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[0][f][e] = 0.0f;
            fence_operands(part);
        }
"""

KERNEL = r"""
// wpack: A tiles as the swizzled shared memory holds them, [G][MTILES][KTILES][A_PARTS][BM*BK]
// (a group's last m-tile trimmed: FilterTiles);
// table: the "table" gather's per-vector offsets; ws, counters: split-K partial tiles and
// arrival counts (all counts zero between launches); im2col_map: the input's tensor map, which
// the copy engine's gather (Gather::copy_engine) reads.
template <class Walk, class Gather>
struct PersistentKernel {
    enum : int { threads = THREADS + LOADERS, min_blocks = MIN_BLOCKS };
    static __device__ __forceinline__ void run(""" + mainloop.RUN_PARAMETERS + r""",
        const TensorMap* im2col_map = nullptr);
};

template <class Walk, class Gather>
__device__ __forceinline__ void PersistentKernel<Walk, Gather>::run(""" + (
    mainloop.RUN_PARAMETERS + r""", const TensorMap* im2col_map)
{""" + mainloop.WARP_SPECIALISED_SMEM + PROLOGUE + mainloop.filled(
        ROLES,
        LOADER=(LOADER_BEGIN + "        if constexpr (Gather::copy_engine) {\n" + LOADER_TMA
                + "        } else {\n"
                + mainloop.filled(LOADER_UNITS, BODY=GATHER_START + LOAD_A_BULK
                                  + gather_nhwc.LOAD_TILE + LOADER_K_TILES)
                + "        }\n"),
        CONSUMER=CONSUMER_BEGIN + wgmma.COMPUTE + PARTIAL_SUM + CONSUMER) + "}\n")
