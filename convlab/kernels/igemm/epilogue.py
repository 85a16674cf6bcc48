"""The epilogue, as types the schedules call: the accumulators to the output, with bias and
ReLU by the ladder's shared `finish_output` (general.EPILOGUE_SOURCE), stored as float32, fp16
or bf16 bits (gpu.elements' `to_out`, OUT_HALF, BF16_BITS); under ADD_KEPT (KEPT_SOURCE) a
residual block's kept activation added before them. The grid schedule's
`StagedStore<NHWC, BN>` stages the tile in shared memory so the stores are coalesced: NCHW a
warp per output channel row, lanes along consecutive pixels; NHWC a warp per pixel, lanes
along consecutive output channels. The wgmma kernel's warp-specialised schedules store
straight from the registers instead (`store_registers_nhwc`, with `prefetch_kept_tile`)."""

# The add-relu epilogue (kernels.base.ADD_RELU): the activation a residual block kept for its
# shortcut, which has the output's shape and layout, read where each output goes and added to
# the accumulator before the bias and ReLU. The block's add and ReLU are then the last conv's
# stores: its output is written once, where a separate add would read it back with the kept
# one and write the sum again. float32, or 16-bit (KEPT_HALF: fp16, or bf16 under BF16_BITS);
# with ADD_KEPT 0 the pointer is never read.
KEPT_SOURCE = r"""
typedef ElementOf<KEPT_HALF, BF16_BITS>::type KeptElement;
typedef KeptElement::bits kept_t;

__device__ __forceinline__ float kept_value(const kept_t* __restrict__ kept, long long i)
{
    return KeptElement::value(__ldg(kept + i));
}

// v, plus the kept element at output offset i where the epilogue adds one.
__device__ __forceinline__ float plus_kept(float v, const kept_t* __restrict__ kept, long long i)
{
    return ADD_KEPT ? v + kept_value(kept, i) : v;
}

__device__ __forceinline__ void prefetch_l2(const void* p)
{
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}
"""

# The warp-specialised schedules' register stores read the kept elements of a whole tile at its
# end. Read from memory one 16-byte vector at a time in the stores' loop, each waited for the
# last, an H200 took 2.9x the plain conv's time on ResNet-50's 1x1 expansions (2026-11-28). So
# each warp asks L2 for its 16 channels of every column of the tile when the tile starts
# (persistent: before its K-tiles; halo: at its epilogue), and the loops below read ahead: the
# 16-byte paths KEPT_AHEAD (16-bit output) or KEPT_AHEAD4 (float32) vectors before they add
# them, the element path every kept element into the accumulators before its first store (but
# beside the float32 16-byte path, where it adds each as it stores it). Its arguments are
# store_registers_nhwc's.
PREFETCH_KEPT = r"""
template <class Pixel>
__device__ __forceinline__ void prefetch_kept_tile(const TileUnit& unit, const out_t* ytile,
                                                   const Pixel& pixel, int tile_warp, int lane,
                                                   const out_t* y, const kept_t* kept)
{
    if (ADD_KEPT && (MG % BM == 0 || unit.mtile * BM + 16 * tile_warp < MG))
        for (int c = lane; c < BN; c += 32) {
            unsigned at;
            if (pixel(c, at)) prefetch_l2(kept + (ytile - y) + 16 * tile_warp + at);
        }
}
"""

# The staged store's one signature, both layouts' (STORE_STAGED calls it).
STAGED_STORE_SIGNATURE = r"""    static __device__ __forceinline__ void store(const float (&acc)[MF][NF][4], float* smem,
                                                 const TileUnit& unit, int npix, int warp,
                                                 int lane, int g8, int t4, int wm, int wn,
                                                 out_t* __restrict__ y,
                                                 const float* __restrict__ bias,
                                                 const kept_t* __restrict__ kept)
"""

# The grid schedule's epilogue: the block's tile (TileN = BN pixels wide) staged in shared
# memory (the stages, free once the mainloop ends) so the stores run along whole rows, then
# stored by `store`: NCHW (Nhwc false) a warp per output channel row, lanes along consecutive
# pixels; NHWC a warp per pixel, lanes along its consecutive output channels, adding the kept
# activation under ADD_KEPT. Templates, so a build never sizes the arrays of one it does not
# call (the wgmma halo schedule's N may be 8). Accumulator (i, j) element e of warp (wm, wn):
# row 16i + g8 + 8*(e/2), column 8j + 2*t4 + e%2 of the warp's tile (g8 = lane / 4,
# t4 = lane % 4).
STAGED_STORE = r"""
template <bool Nhwc, int TileN> struct StagedStore;

template <int TileN> struct StagedStore<false, TileN> {
""" + STAGED_STORE_SIGNATURE + r"""    {
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

        long long yoff[TileN / 32];
#pragma unroll
        for (int i = 0; i < TileN / 32; ++i) {
            const int n = unit.ntile * BN + lane + 32 * i;
            if (n < npix) {
                const int b = n / HWO;
                yoff[i] = ((long long)b * M + unit.group * MG) * HWO + (n - b * HWO);
            } else {
                yoff[i] = -1;
            }
        }
        for (int m = warp; m < BM; m += NWARPS) {
            const int mg = unit.mtile * BM + m;
            if (mg >= MG) break;
#pragma unroll
            for (int i = 0; i < TileN / 32; ++i) {
                if (yoff[i] < 0) continue;
                y[yoff[i] + (long long)mg * HWO] =
                    to_out(finish_output(cs[m * C_LD + lane + 32 * i], bias, unit.group * MG + mg));
            }
        }
    }
};

template <int TileN> struct StagedStore<true, TileN> {
""" + STAGED_STORE_SIGNATURE + r"""    {
        // C staged transposed, [n][m] (C_LD = BM + 4): the fragment writes of a warp hit 32
        // banks, and each pixel's output channels are contiguous for the stores.
        float* cs = smem;
#pragma unroll
        for (int i = 0; i < MF; ++i)
#pragma unroll
            for (int j = 0; j < NF; ++j) {
                const int row = wm * WM + i * 16 + g8, col = wn * WN + j * 8 + 2 * t4;
                cs[col * C_LD + row] = acc[i][j][0];
                cs[(col + 1) * C_LD + row] = acc[i][j][1];
                cs[col * C_LD + row + 8] = acc[i][j][2];
                cs[(col + 1) * C_LD + row + 8] = acc[i][j][3];
            }
        __syncthreads();

        for (int n = warp; n < BN; n += NWARPS) {
            const int pix = unit.ntile * BN + n;
            if (pix >= npix) break;
            out_t* yrow = y + (long long)pix * M + unit.group * MG;
#pragma unroll
            for (int m = lane; m < BM; m += 32) {
                const int mg = unit.mtile * BM + m;
                if (mg < MG)
                    yrow[mg] = to_out(finish_output(
                        plus_kept(cs[n * C_LD + m], kept, yrow + mg - y), bias,
                        unit.group * MG + mg));
            }
        }
    }
};
"""

# The grid kernels' call of it, after the mainloop (and split-K's meeting).
STORE_STAGED = r"""
    StagedStore<NHWC, BN>::store(acc, smem, unit, npix, warp, lane, g8, t4, wm, wn, y, bias,
                                 kept);
"""

# The warp-specialised wgmma schedules' store, straight from the MMA warps' accumulators (no C
# tile in shared memory: the stages hold the next tile's operands meanwhile). The schedule
# gives it the tile's `unit` (igemm.tile_walks); `pixel(q, at)`: whether the tile's GEMM column
# q is an output, and the element offset of its channel row from ytile; `ytile`, the tile's
# first output pixel at the tile's first output channel; `ythread`, ytile at the thread's first
# channel (16 tile_warp + g8); `tile_warp`: which 16 rows of the tile the warp holds; the
# lane's fragment coordinates (g8, t4); and `scratches`: the shared address where the warps'
# STORE_SCRATCH bytes start, which only the 16-byte paths (VECTOR_STORE) use. The caller forms
# ythread: formed here, it was re-formed at each column's stores, and the halo schedule's
# shipped ResNet 3x3 tiling ran 1.025-1.034x the time (H200, 2026-11-29). Each thread holds
# two output channels and, per n-block, two columns: their bias is read once a tile and each
# column's address is reckoned once for both channels. Both schedules had a copy of this loop
# reading the bias and forming a 64-bit address per element, about 13 instructions an output
# (SASS of the VGG 3x3 tiles); this one takes half that, and on an H100 it timed the same
# (2026-11-26).
# What the stores cost is their count: an fp16 tile of 128x256 written an element at a time is
# 128 2-byte stores a thread. With the stores switched off the persistent kernels took 1.15-1.17x
# (AlexNet conv3) and 1.35-1.38x (VGG 3x3) fewer cycles; with the same bytes in 16-byte stores,
# 16 a thread, 1.08x and 1.21x (H100, 2026-11-26; aiming them at a slice that stays in L2
# changed nothing, so it is not the traffic). Turning the fragments around in registers
# (movmatrix and a 4x4 shuffle within each quad) cost more than it saved. So under VECTOR_STORE
# (fp16 output of the persistent schedule, each group's channels on 16 bytes, y itself on 16
# bytes; float32 output of an add-relu epilogue has its own path below) a warp writes each
# pair of n-blocks, 16 channels x 16 columns, to STORE_SCRATCH bytes of shared memory with one
# transposing stmatrix, reads it back 8 channels of one column a lane, and stores those as one
# 16-byte vector. Column P's two 16-byte halves swap places when P & 4: the eight rows of each
# matrix then fill distinct bank quads. On an H100 run back to back, where the 700 W cap held
# the clock at 1,485-1,790 MHz, this took conv3 and conv4 1.02-1.04x and the VGG layer 1.11x
# less time; in the tuner's and compare's timing (short bursts after a spin kernel, 1.15-1.29x
# faster than back to back; the clock was not sampled there) the same tilings timed the same
# as before, within 1% (H100, 2026-11-26).
STORE_REGISTERS_NHWC = r"""
template <class Pixel>
__device__ __forceinline__ void store_registers_nhwc(float (&acc)[MF][NF][4],
                                                     const TileUnit& unit, const Pixel& pixel,
                                                     out_t* const ytile, out_t* const ythread,
                                                     int tile_warp, int warp, int lane, int g8,
                                                     int t4, unsigned scratches, out_t* y,
                                                     const float* bias, const kept_t* kept)
{
    const int m0 = unit.mtile * BM + 16 * tile_warp + g8;
    const bool first = MG % BM == 0 || m0 < MG, second = MG % BM == 0 || m0 + 8 < MG;
    float b0 = 0.0f, b1 = 0.0f;
    if (HAS_BIAS && first) b0 = __ldg(bias + unit.group * MG + m0);
    if (HAS_BIAS && second) b1 = __ldg(bias + unit.group * MG + m0 + 8);
    // The 16-byte paths, compiled only under VECTOR_STORE. A caller's y (or kept) may be a
    // view that does not start on 16 bytes: element stores then.
    const bool vector = VECTOR_STORE && (reinterpret_cast<unsigned long long>(y) & 15) == 0
        && (!ADD_KEPT || (reinterpret_cast<unsigned long long>(kept)
                          & (OUT_HALF ? 15 : 4 * sizeof(kept_t) - 1)) == 0);
    if constexpr (VECTOR_STORE) if (vector) {
        if constexpr (OUT_HALF) {
            // Matrix i (0-3) is n-block f + i/2, channels 8(i%2)..; lane L names row L%8 of
            // matrix L/8, which lands as scratch column P = 8(L/16) + L%8, half (L/8)%2.
            // Lane L then reads column P = L/2, half L%2: channels 16w + 8(L%2).. of tile
            // column 8f + P.
            const unsigned scratch = scratches + warp * STORE_SCRATCH;
            const int sp = 8 * (lane >> 4) + (lane & 7), sh = (lane >> 3) & 1;
            const unsigned row = scratch + sp * 32 + ((sh ^ (sp >> 2)) & 1) * 16;
            const int lp = lane >> 1, lh = lane & 1;
            const unsigned mine = scratch + lp * 32 + ((lh ^ (lp >> 2)) & 1) * 16;
            const bool live =
                MG % BM == 0 || unit.mtile * BM + 16 * tile_warp + 8 * lh < MG;
            out_t* const yv = ytile + 16 * tile_warp + 8 * lh;
            // Pair q (n-blocks 2q, 2q + 1) adds the kept vector loaded KEPT_AHEAD pairs
            // before.
            kept8_t ahead[KEPT_AHEAD];
            auto kept_of = [&](int q) {
                unsigned at;
                return live && pixel(16 * q + lp, at) ? load_kept8(kept + (yv + at - y))
                                                      : kept8_t();
            };
            if (ADD_KEPT) {
#pragma unroll
                for (int q = 0; q < KEPT_AHEAD && q < NF / 2; ++q) ahead[q] = kept_of(q);
            }
#pragma unroll
            for (int f = 0; f + 1 < NF; f += 2) {
                const int q = f / 2;
                kept8_t k;
                if (ADD_KEPT) {
                    k = ahead[q % KEPT_AHEAD];
                    if (q + KEPT_AHEAD < NF / 2)
                        ahead[q % KEPT_AHEAD] = kept_of(q + KEPT_AHEAD);
                }
                unsigned v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float* a = acc[0][f + i / 2] + 2 * (i & 1);
                    const float b = i & 1 ? b1 : b0;
                    // The kept activation is added to the vector read back (add_kept8):
                    // the bias only, here, where the epilogue adds one.
                    v[i] = ADD_KEPT
                        ? half_pair(a[0] + b, a[1] + b)
                        : half_pair(finish_value(a[0], b), finish_value(a[1], b));
                }
                stmatrix_x4_trans(row, v);
                __syncwarp();
                const uint4 out = load_shared16(mine);
                __syncwarp();  // read before the next pair's stmatrix
                unsigned at;
                if (live && pixel(8 * f + lp, at))
                    store16(yv + at, ADD_KEPT ? add_kept8(out, k) : out);
            }
        } else {
            // float32 (an add-relu epilogue): n-block f, 16 channels x 8 columns, goes to
            // the scratch as [column][channel] and comes back as one 16-byte vector a
            // lane: channels 4(L%4).. of column L/4. Bit 3 of the channel flips where bit 1
            // of the column is set, so a warp's fragment writes take two turns of the
            // banks, not four (its vector reads take one either way).
            const unsigned scratch = scratches + warp * STORE_SCRATCH;
            const int lc = lane >> 2, mv = 16 * tile_warp + 4 * (lane & 3);
            const unsigned mine = scratch + 4 * (16 * lc + ((mv & 15) ^ ((lc & 2) << 2)));
            const bool live = MG % BM == 0 || unit.mtile * BM + mv < MG;
            float bias4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (HAS_BIAS && live)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    bias4[i] = __ldg(bias + unit.group * MG + unit.mtile * BM + mv + i);
            out_t* const yv = ytile + mv;
            // n-block f adds the kept vector loaded KEPT_AHEAD4 n-blocks before.
            kept4_t ahead[KEPT_AHEAD4];
            auto kept_of = [&](int f) {
                unsigned at;
                return live && pixel(8 * f + lc, at) ? load_kept4(kept + (yv + at - y))
                                                     : kept4_t();
            };
#pragma unroll
            for (int f = 0; f < KEPT_AHEAD4 && f < NF; ++f) ahead[f] = kept_of(f);
#pragma unroll
            for (int f = 0; f < NF; ++f) {
                const float4 k = kept4_values(ahead[f % KEPT_AHEAD4]);
                if (f + KEPT_AHEAD4 < NF) ahead[f % KEPT_AHEAD4] = kept_of(f + KEPT_AHEAD4);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int column = 2 * t4 + (e & 1), channel = g8 + 8 * (e >> 1);
                    const int word = 16 * column + (channel ^ ((t4 & 1) << 3));
                    store_shared_float(scratch + 4 * word, acc[0][f][e]);
                }
                __syncwarp();
                const uint4 raw = load_shared16(mine);
                __syncwarp();  // read before the next n-block's writes
                const float sum[4] = {
                    __uint_as_float(raw.x) + k.x, __uint_as_float(raw.y) + k.y,
                    __uint_as_float(raw.z) + k.z, __uint_as_float(raw.w) + k.w};
                unsigned out[4];
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    out[i] = __float_as_uint(to_out(finish_value(sum[i], bias4[i])));
                unsigned at;
                if (live && pixel(8 * f + lc, at))
                    store16(yv + at, make_uint4(out[0], out[1], out[2], out[3]));
            }
        }
    }
    // The n-blocks the 16-byte path stored. Kept a constant beside the run-time
    // `vector`: as one run-time count it made ptxas build fp16's plain 128x256 conv 1.37x
    // slower (ResNet-50's layer1 expansion at batch 128, 0.1044 against 0.0761 ms alone,
    // H200, 2026-11-28, results/h200/resnet50-vgg16-classes-20261128/logs/).
    constexpr int vector_blocks = !VECTOR_STORE ? 0 : OUT_HALF ? NF - NF % 2 : NF;
    // Element e of n-block f: channel m0 + 8*(e/2), column 8f + 2*t4 + e%2 (after the
    // vector stores, an odd last n-block). The kept elements are all added first: loads
    // with no store between them, in flight together. Beside float32's 16-byte path,
    // which leaves this one the views off 16 bytes, each is added as it is stored: the
    // loads in flight together took registers the 16-byte path's ring needs (ptxas
    // spilled 8-68 bytes at bn 128-256 in tf32).
    constexpr bool add_first = !(VECTOR_STORE && !OUT_HALF);
    if (ADD_KEPT && add_first) {
#pragma unroll
        for (int f = 0; f < NF; ++f)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (vector && f < vector_blocks) continue;
                unsigned at;
                if (pixel(8 * f + 2 * t4 + h, at)) {
                    const long long i = ythread + at - y;
                    if (first) acc[0][f][h] += kept_value(kept, i);
                    if (second) acc[0][f][2 + h] += kept_value(kept, i + 8);
                }
            }
    }
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (vector && f < vector_blocks) continue;
            unsigned at;
            if (pixel(8 * f + 2 * t4 + h, at)) {
                out_t* const p = ythread + at;
                const long long i = p - y;
                if (first)
                    p[0] = to_out(finish_value(add_first ? acc[0][f][h]
                                                         : plus_kept(acc[0][f][h], kept, i),
                                               b0));
                if (second)
                    p[8] = to_out(finish_value(add_first ? acc[0][f][2 + h]
                                                         : plus_kept(acc[0][f][2 + h], kept,
                                                                     i + 8),
                                               b1));
            }
        }
}
"""
