"""tensorcore: implicit GEMM on tensor cores (mma.sync, TF32 inputs, FP32 accumulation)."""

COMMENT = r"""
// tensorcore: changes from implicit-gemm -- the multiply-accumulates run on the tensor cores,
// one warp-wide mma.sync.m16n8k8 (TF32 inputs, FP32 accumulation) at a time, instead of the
// FP32 pipes: on Hopper they offer several times the FP32 FMA rate. Inputs are rounded to TF32
// (10 mantissa bits), so results carry about 1e-4 relative error: a tf32 variant, checked at 2e-3.
// A block owns BN = 32*NF consecutive output pixels of one image and BM = 16*MF channels. It
// copies the input rows those pixels need (all channels) into shared memory once, and then
// gathers the im2col operand B for each mma straight from that copy through a table of (c,p,q)
// offsets: the K*K-fold reuse of every input pixel is served by shared memory, never by global
// memory, and there is no barrier inside the k loop. Filters, zero-padded on the host to
// [16*MF*gridDim.y][KDP], feed operand A from the read-only cache. Inside each k-step of 8 the
// k order is permuted (fragment column t holds k = 2t, column t+4 holds 2t+1) -- a GEMM does not
// care -- so each A pair and each offset pair is one 8-byte load.
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
"""

MMA_STEP = r"""
// One k-step of 8 for the warp's MF x NF tiles: round the fragments to TF32, multiply.
__device__ __forceinline__ void mma_step(float (&acc)[MF][NF][4], const float (&a)[MF][4],
                                         const float (&b)[NF][2])
{
    unsigned int ah[MF][4], bh[NF][2];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) ah[i][e] = to_tf32(a[i][e]);
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) bh[j][e] = to_tf32(b[j][e]);
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) mma_tf32(acc[i][j], ah[i], bh[j]);
}
"""

BODY = r"""
// Compile-time: C, H, W, M, K, MF, NF, ROWS (input rows a block stages).
#define HO (H - K + 1)
#define WO (W - K + 1)
#define HW (HO * WO)
#define KK (K * K)
#define KD (C * KK)
#define KDP ((KD + 7) / 8 * 8)
#define BM (16 * MF)
#define BN (32 * NF)
#define PER_IMAGE ((HW + BN - 1) / BN)

extern "C" __global__ void __launch_bounds__(128)
conv_forward(const float* __restrict__ x, const float* __restrict__ wp, float* __restrict__ y, int B)
{
    extern __shared__ float smem[];
    float* xs = smem;                                      // [C][ROWS][W]
    int* koff = reinterpret_cast<int*>(smem + C * ROWS * W);  // [KDP]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const long long b = blockIdx.x / PER_IMAGE;
    const int hw0 = (int)(blockIdx.x % PER_IMAGE) * BN;
    const int m0 = blockIdx.y * BM;
    const int row0 = hw0 / WO;  // the block's first output row is also its first input row
    const int rows = min(ROWS, H - row0);

    const float* xb = x + b * (C * H * W) + row0 * W;
    for (int i = tid; i < C * ROWS * W; i += 128) {
        const int c = i / (ROWS * W), rc = i % (ROWS * W);
        xs[i] = rc / W < rows ? __ldg(xb + c * (H * W) + rc) : 0.0f;
    }
    // Padded k (>= KD) reads offset 0: a finite value, multiplied by a zero filter tap.
    for (int k = tid; k < KDP; k += 128)
        koff[k] = k < KD ? (k / KK) * (ROWS * W) + ((k % KK) / K) * W + k % K : 0;
    __syncthreads();

    // This lane's B columns (fragment column g of each n-tile); pixels past the image are
    // clamped to its last pixel, computed and never stored.
    int noff[NF];
#pragma unroll
    for (int j = 0; j < NF; ++j) {
        const int hw = min(hw0 + warp * (NF * 8) + j * 8 + g, HW - 1);
        noff[j] = (hw / WO - row0) * W + hw % WO;
    }
    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const float* wa = wp + (long long)(m0 + g) * KDP + 2 * t;
#pragma unroll 2
    for (int k = 0; k < KDP; k += 8) {
        float a[MF][4], bf[NF][2];
#pragma unroll
        for (int i = 0; i < MF; ++i) {
            const float2 lo = __ldg(reinterpret_cast<const float2*>(wa + (i * 16) * KDP + k));
            const float2 hi = __ldg(reinterpret_cast<const float2*>(wa + (i * 16 + 8) * KDP + k));
            a[i][0] = lo.x; a[i][2] = lo.y;  // rows g and g+8; k = 2t and 2t+1
            a[i][1] = hi.x; a[i][3] = hi.y;
        }
        const int2 ko = *reinterpret_cast<const int2*>(koff + k + 2 * t);
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            bf[j][0] = xs[ko.x + noff[j]];
            bf[j][1] = xs[ko.y + noff[j]];
        }
        mma_step(acc, a, bf);
    }

    // Accumulator element e of tile (i, j): channel row g + 8*(e/2), pixel column 2t + e%2.
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
                    if (m < M) yb[(long long)m * HW + hw] = acc[i][j][2 * half + e];
                }
        }
}
"""

SOURCE = COMMENT + HEADER + MMA_STEP + BODY

import numpy as np  # noqa: E402

from .base import Op, Support, Variant, blocks, check_epilogue  # noqa: E402

MAX_MF = 4
ACCUMULATORS = 96  # MF*NF*4 registers per thread
MAX_SMEM = 96 * 1024


def m_fragments(M: int) -> int:
    """MF: 16-row tensor-core tiles per block, enough for all channels up to 64."""
    return min(MAX_MF, blocks(M, 16))


def n_fragments(shape) -> int:
    """NF: 8-pixel tiles per warp; the largest that wastes the fewest pixels of an image."""
    hw = shape.Ho * shape.Wo
    mf = m_fragments(shape.M)
    options = [nf for nf in range(1, 9) if mf * nf * 4 <= ACCUMULATORS]
    return min(options, key=lambda nf: (blocks(hw, 32 * nf) * 32 * nf, -nf))


def staged_rows(shape) -> int:
    """Input rows a block needs: the output rows its BN pixels span, plus K - 1."""
    bn = 32 * n_fragments(shape)
    out_rows = min((bn - 1) // shape.Wo + 2, shape.Ho)
    return out_rows + shape.K - 1


def smem_bytes(shape) -> int:
    kdp = blocks(shape.C * shape.K * shape.K, 8) * 8
    return 4 * (shape.C * staged_rows(shape) * shape.W + kdp)


class TensorCore(Variant):
    name = "tensorcore"
    summary = "implicit GEMM on tensor cores: mma.sync TF32 inputs, FP32 accumulation"
    precision = "tf32"
    source = SOURCE

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        if smem_bytes(shape) > MAX_SMEM:
            return Support(False, f"the staged input rows need {smem_bytes(shape)} bytes of shared "
                                  f"memory; the limit used is {MAX_SMEM}")
        return Support(True)

    def defines(self, shape, epilogue=None):
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
                "MF": m_fragments(shape.M), "NF": n_fragments(shape), "ROWS": staged_rows(shape)}

    def prepare(self, shape, weights, epilogue=None):
        import cupy

        check_epilogue(self, epilogue)
        compiled = self.compile(shape)
        kernel = compiled.module.get_function("conv_forward")
        smem = smem_bytes(shape)
        kernel.max_dynamic_shared_size_bytes = smem
        bm = 16 * m_fragments(shape.M)
        kd = shape.C * shape.K * shape.K
        kdp = blocks(kd, 8) * 8
        padded = np.zeros((blocks(shape.M, bm) * bm, kdp), dtype=np.float32)
        padded[:shape.M, :kd] = weights.reshape(shape.M, kd)
        wp = cupy.asarray(padded)
        per_image = blocks(shape.Ho * shape.Wo, 32 * n_fragments(shape))
        grid = (shape.B * per_image, blocks(shape.M, bm))
        batch = np.int32(shape.B)

        def launch(x, y):
            kernel(grid, (128,), (x, wp, y, batch), shared_mem=smem)

        return Op(launch, shape.output_shape, compiled.seconds)
