"""tensorcore: implicit GEMM on tensor cores (mma.sync, TF32 inputs, FP32 accumulation)."""

from .general import EPILOGUE_SOURCE

COMMENT = r"""
// tensorcore: changes from implicit-gemm -- the multiply-accumulates run on the tensor cores,
// one warp-wide mma.sync.m16n8k8 (TF32 inputs, FP32 accumulation) at a time, instead of the
// FP32 pipes: on Hopper they offer several times the FP32 FMA rate. Inputs are rounded to TF32
// (10 mantissa bits), so results carry about 1e-4 relative error: a tf32 variant, checked with
// the tf32 rounding bound (u = 2^-11).
// A block owns BN = 32*NF consecutive output pixels of one image and BM = 16*MF channels. It
// copies the input rows those pixels need (all channels) into shared memory once, rounded to
// TF32 on the way, and then gathers the im2col operand B for each mma straight from that copy
// through a table of (c,p,q) offsets: the K*K-fold reuse of every input pixel is served by shared
// memory, never by global memory, and there is no barrier inside the k loop. The filters (operand
// A) are rounded and laid out on the host in fragment order, so a lane fetches its four A values
// of a k-step with one coalesced 16-byte load. Inside each k-step of 8 the k order is permuted
// (fragment column t holds k = 2t, column t+4 holds 2t+1) -- a GEMM does not care -- so each pair
// of (c,p,q) offsets is one 8-byte load.
// General layers: with stride S and padding P a block stages the input rows and columns its
// pixels' windows cover, (rows-1)*S+K rows of (WO-1)*S+K columns starting at input column -P,
// zeros where they fall outside the image. Each group is its own GEMM: a block's BM channels lie
// in one group (grid.y walks each group's channel blocks, the host packs each group's filters),
// and it stages that group's channels only. Where all of a group's channels do not fit in shared
// memory, they are staged CCH at a time (slabs of whole k-steps, a barrier between slabs). The
// store adds the bias and the fused ReLU. For plain layers all of it folds away.
"""

HEADER = r"""
__device__ __forceinline__ unsigned int to_tf32(float f)
{
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned int (&a)[4],
                                         const unsigned int (&b)[2])
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void as_bits(const float4& v, unsigned int (&r)[4])
{
    r[0] = __float_as_uint(v.x); r[1] = __float_as_uint(v.y);
    r[2] = __float_as_uint(v.z); r[3] = __float_as_uint(v.w);
}
"""

MMA_STEP = r"""
// A_PARTS: filter parts the host packs (the TF32-rounded filters). STAGE: how an input value
// enters shared memory (rounded to TF32 once, not at every use).
#define A_PARTS 1
#define STAGE(v) __uint_as_float(to_tf32(v))

__device__ __forceinline__ void mma_step(float (&acc)[MF][NF][4], const float4 (&a)[A_PARTS][MF],
                                         const float (&b)[NF][2])
{
    unsigned int ah[MF][4], bh[NF][2];
#pragma unroll
    for (int i = 0; i < MF; ++i) as_bits(a[0][i], ah[i]);
#pragma unroll
    for (int j = 0; j < NF; ++j) {
        bh[j][0] = __float_as_uint(b[j][0]);
        bh[j][1] = __float_as_uint(b[j][1]);
    }
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) mma_tf32(acc[i][j], ah[i], bh[j]);
}
"""

BODY = r"""
// Compile-time: C, H, W, M, K, MF, NF, ROWS (input rows a block stages), WS (staged row width),
// CCH (input channels staged at a time), NSLABS (CCH-channel slabs per group), KT (entries of
// the offset table), STRIDE, PAD, GROUPS, HAS_BIAS, RELU.
#define HO ((H + 2 * PAD - K) / STRIDE + 1)
#define WO ((W + 2 * PAD - K) / STRIDE + 1)
#define HW (HO * WO)
#define KK (K * K)
#define CG (C / GROUPS)
#define MG (M / GROUPS)
#define KD (CG * KK)
#define KDP ((KD + 7) / 8 * 8)
#define KSTEPS (KDP / 8)
// k-steps per slab: with several slabs CCH is a multiple of 8, so a slab is whole k-steps.
#define SLAB_STEPS (NSLABS == 1 ? KSTEPS : CCH * KK / 8)
#define BM (16 * MF)
#define MBLOCKS ((MG + BM - 1) / BM)  // channel blocks per group
#define BN (32 * NF)
#define PER_IMAGE ((HW + BN - 1) / BN)
// A whole unpadded row is staged (stride and width fit): the copy is contiguous per channel.
#define FULL_ROWS (PAD == 0 && WS == W)
""" + EPILOGUE_SOURCE + r"""
// Stage channels slab*CCH ... slab*CCH+CCH-1 of the group at xg: input rows irow0 ... irow0+ROWS-1,
// columns -PAD ... WS-PAD-1, rounded by STAGE; zeros outside the image and for channels past
// the group's last.
__device__ __forceinline__ void stage_slab(float* __restrict__ xs, const float* __restrict__ xg,
                                           int slab, int irow0)
{
    const float* xc = xg + slab * CCH * (H * W);
#if FULL_ROWS
    const float* xr = xc + irow0 * W;
    const int rows = min(ROWS, H - irow0);
    for (int i = threadIdx.x; i < CCH * ROWS * W; i += 128) {
        const int c = i / (ROWS * W), rc = i % (ROWS * W);
        const bool inside = rc / W < rows && (CCH == CG || slab * CCH + c < CG);
        xs[i] = inside ? STAGE(__ldg(xr + c * (H * W) + rc)) : 0.0f;
    }
#else
    for (int i = threadIdx.x; i < CCH * ROWS * WS; i += 128) {
        const int c = i / (ROWS * WS), hi = irow0 + (i / WS) % ROWS, wi = i % WS - PAD;
        const bool inside = (unsigned)hi < (unsigned)H && (unsigned)wi < (unsigned)W &&
                            (CCH == CG || slab * CCH + c < CG);
        xs[i] = inside ? STAGE(__ldg(xc + c * (H * W) + hi * W + wi)) : 0.0f;
    }
#endif
}

// wp: float4 fragments [A_PARTS][gridDim.y][KSTEPS][MF][32 lanes], packed by the host; block
// row y = group * MBLOCKS + (channel block within the group).
extern "C" __global__ void __launch_bounds__(128)
conv_forward(const float* __restrict__ x, const float4* __restrict__ wp,
             const float* __restrict__ bias, float* __restrict__ y, int B)
{
    extern __shared__ float smem[];
    int* koff = reinterpret_cast<int*>(smem);  // [KT], first: KT is even, so xs stays 8-aligned
    float* xs = smem + KT;                      // [CCH][ROWS][WS]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const long long b = blockIdx.x / PER_IMAGE;
    const int hw0 = (int)(blockIdx.x % PER_IMAGE) * BN;
    const int orow0 = hw0 / WO;                  // the block's first output row
    const int irow0 = orow0 * STRIDE - PAD;      // the input row staged first (row 0 of xs)
    const int group = GROUPS > 1 ? blockIdx.y / MBLOCKS : 0;
    const float* xg = x + b * (C * H * W) + group * (CG * H * W);

    stage_slab(xs, xg, 0, irow0);
    // Offsets of k = (c,p,q) within a slab. Padded k (>= KD, only with one slab) reads offset 0:
    // a finite value, multiplied by a zero filter tap.
    for (int k = tid; k < KT; k += 128)
        koff[k] = k < KD ? (k / KK) * (ROWS * WS) + ((k % KK) / K) * WS + k % K : 0;
    __syncthreads();

    // This lane's B columns (fragment column g of each n-tile); pixels past the image are
    // clamped to its last pixel, computed and never stored. Staged column 0 is input column -PAD.
    int noff[NF];
#pragma unroll
    for (int j = 0; j < NF; ++j) {
        const int hw = min(hw0 + warp * (NF * 8) + j * 8 + g, HW - 1);
        noff[j] = (hw / WO - orow0) * (STRIDE * WS) + hw % WO * STRIDE;
    }
    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const float4* wa = wp + (long long)blockIdx.y * (KSTEPS * MF * 32) + lane;
    const long long part = (long long)gridDim.y * (KSTEPS * MF * 32);
    for (int slab = 0; slab < NSLABS; ++slab) {
        if (slab > 0) {  // never with one slab
            __syncthreads();  // every warp is done with the previous slab
            stage_slab(xs, xg, slab, irow0);
            __syncthreads();
        }
        const int s0 = slab * SLAB_STEPS, s1 = min(KSTEPS, s0 + SLAB_STEPS);
#pragma unroll 2
        for (int s = s0; s < s1; ++s) {
            float4 a[A_PARTS][MF];
            float bf[NF][2];
#pragma unroll
            for (int h = 0; h < A_PARTS; ++h)
#pragma unroll
                for (int i = 0; i < MF; ++i) a[h][i] = __ldg(wa + h * part + (s * MF + i) * 32);
            const int2 ko = *reinterpret_cast<const int2*>(koff + (s - s0) * 8 + 2 * t);
#pragma unroll
            for (int j = 0; j < NF; ++j) {
                bf[j][0] = xs[ko.x + noff[j]];
                bf[j][1] = xs[ko.y + noff[j]];
            }
            mma_step(acc, a, bf);
        }
    }

    // Accumulator element e of tile (i, j): channel row g + 8*(e/2), pixel column 2t + e%2.
    // The block's channels: from m0 to at most its group's end (derived from blockIdx.y here
    // rather than kept live through the k loop).
    const int mend = (GROUPS > 1 ? blockIdx.y / MBLOCKS + 1 : 1) * MG;
    const int m0 = mend - MG + (GROUPS > 1 ? blockIdx.y % MBLOCKS : blockIdx.y) * BM;
    float* yb = y + b * ((long long)M * HW);
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int hw = hw0 + warp * (NF * 8) + j * 8 + 2 * t + e;
            if (hw >= HW) continue;
#pragma unroll
            for (int i = 0; i < MF; ++i)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int m = m0 + i * 16 + g + 8 * half;
                    if (m < mend)
                        yb[(long long)m * HW + hw] = finish_output(acc[i][j][2 * half + e], bias, m);
                }
        }
}
"""

SOURCE = COMMENT + HEADER + MMA_STEP + BODY

from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import RELU, Op, Support, Variant, blocks, check_inputs  # noqa: E402
from .general import device_bias, layer_defines  # noqa: E402

MAX_MF = 4
ACCUMULATORS = 96  # MF*NF*4 registers per thread
MAX_SMEM = 96 * 1024  # two blocks per SM


def round_tf32(a: np.ndarray) -> np.ndarray:
    """What cvt.rna.tf32.f32 does: keep 10 mantissa bits, rounding half away from zero."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def pack_fragments(weights: np.ndarray, mf: int) -> np.ndarray:
    """Filters as mma.m16n8k8 A fragments: [gridDim.y][KSTEPS][MF][lane][4], zero-padded.

    Lane (g, t) of m-tile i in k-step s holds rows 16i+g and 16i+g+8 at k = 8s+2t and 8s+2t+1,
    in the order the fragment registers a0..a3 want them.
    """
    M = weights.shape[0]
    kd = weights[0].size
    bm = 16 * mf
    gy, ksteps = blocks(M, bm), blocks(kd, 8)
    padded = np.zeros((gy * bm, ksteps * 8), dtype=np.float32)
    padded[:M, :kd] = weights.reshape(M, kd)
    # rows -> (gy, i, half, g); k -> (s, t, e); fragment register = 2*e + half
    frag = padded.reshape(gy, mf, 2, 8, ksteps, 4, 2).transpose(0, 4, 1, 3, 5, 6, 2)
    return np.ascontiguousarray(frag).reshape(gy, ksteps, mf, 32, 4)


def pack_groups(weights: np.ndarray, groups: int, mf: int) -> np.ndarray:
    """Each group's filters packed on their own and stacked: block row y = g * MBLOCKS + i."""
    return np.concatenate([pack_fragments(part, mf) for part in np.split(weights, groups)])


def m_fragments(Mg: int) -> int:
    """MF: 16-row tensor-core tiles per block, enough for a group's channels up to 64."""
    return min(MAX_MF, blocks(Mg, 16))


def n_fragments(shape) -> int:
    """NF: 8-pixel tiles per warp; the largest that wastes the fewest pixels of an image."""
    hw = shape.Ho * shape.Wo
    mf = m_fragments(shape.Mg)
    options = [nf for nf in range(1, 9) if mf * nf * 4 <= ACCUMULATORS]
    return min(options, key=lambda nf: (blocks(hw, 32 * nf) * 32 * nf, -nf))


@dataclass(frozen=True)
class Staging:
    """What a block copies into shared memory: ROWS input rows of WS columns for CCH channels
    at a time (NSLABS times per group), next to an offset table of KT entries."""

    rows: int
    width: int
    channels: int  # CCH; 0 when not even 8 channels fit
    slabs: int
    table: int

    @property
    def smem(self) -> int:
        return 4 * (self.table + self.channels * self.rows * self.width)


def staging(shape) -> Staging:
    """Rows: the output rows a block's BN pixels span (at most (BN-1)//Wo + 2), their windows
    (rows-1)*stride + K input rows; width: the columns all windows of a row cover, from input
    column -pad. All of a group's channels when they fit in MAX_SMEM; else slabs of a multiple
    of 8 channels (whole k-steps), as few and as even as fit."""
    out_rows = min((32 * n_fragments(shape) - 1) // shape.Wo + 2, shape.Ho)
    rows = (out_rows - 1) * shape.stride + shape.K
    width = (shape.Wo - 1) * shape.stride + shape.K
    kk = shape.K * shape.K
    whole = Staging(rows, width, shape.Cg, 1, blocks(shape.Cg * kk, 8) * 8)
    if whole.smem <= MAX_SMEM:
        return whole
    fit = MAX_SMEM // (4 * (rows * width + kk)) // 8 * 8
    if fit == 0:
        return Staging(rows, width, 0, 0, 0)
    channels = blocks(blocks(shape.Cg, blocks(shape.Cg, fit)), 8) * 8
    return Staging(rows, width, channels, blocks(shape.Cg, channels), channels * kk)


class TensorCore(Variant):
    name = "tensorcore"
    summary = "implicit GEMM on tensor cores: mma.sync TF32 inputs, FP32 accumulation"
    precision = "tf32"
    source = SOURCE
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        stage = staging(shape)
        if not stage.channels:
            return Support(False, f"8 channels of the {stage.rows} staged input rows of width "
                                  f"{stage.width} need more than the {MAX_SMEM} bytes of shared "
                                  f"memory used")
        return Support(True)

    def defines(self, shape, epilogue=None):
        stage = staging(shape)
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
                "MF": m_fragments(shape.Mg), "NF": n_fragments(shape), "ROWS": stage.rows,
                "WS": stage.width, "CCH": stage.channels, "NSLABS": stage.slabs,
                "KT": stage.table, **layer_defines(shape, epilogue)}

    def filter_parts(self, weights: np.ndarray) -> list[np.ndarray]:
        """The filter arrays the kernel multiplies: here, the filters rounded to TF32."""
        return [round_tf32(weights)]

    def prepare(self, shape, weights, epilogue=None, bias=None):
        import cupy

        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        smem = staging(shape).smem
        kernel.max_dynamic_shared_size_bytes = smem
        mf = m_fragments(shape.Mg)
        wp = cupy.asarray(np.stack([pack_groups(part, shape.groups, mf)
                                    for part in self.filter_parts(weights)]))
        b = device_bias(bias)
        per_image = blocks(shape.Ho * shape.Wo, 32 * n_fragments(shape))
        grid = (shape.B * per_image, shape.groups * blocks(shape.Mg, 16 * mf))
        batch = np.int32(shape.B)

        def launch(x, y):
            kernel(grid, (128,), (x, wp, b, y, batch), shared_mem=smem)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue)
