"""tensorcore: implicit GEMM on tensor cores (mma.sync, TF32 inputs, FP32 accumulation)."""

COMMENT = r"""
// tensorcore: changes from implicit-gemm -- the multiply-accumulates run on the tensor cores,
// one warp-wide mma.sync.m16n8k8 (TF32 inputs, FP32 accumulation) at a time, instead of the
// FP32 pipes: on Hopper they offer several times the FP32 FMA rate. Inputs are rounded to TF32
// (10 mantissa bits), so results carry about 1e-4 relative error: a tf32 variant, checked at 2e-3.
// A block owns BN = 32*NF consecutive output pixels of one image and BM = 16*MF channels. It
// copies the input rows those pixels need (all channels) into shared memory once, rounded to
// TF32 on the way, and then gathers the im2col operand B for each mma straight from that copy
// through a table of (c,p,q) offsets: the K*K-fold reuse of every input pixel is served by shared
// memory, never by global memory, and there is no barrier inside the k loop. The filters (operand
// A) are rounded and laid out on the host in fragment order, so a lane fetches its four A values
// of a k-step with one coalesced 16-byte load. Inside each k-step of 8 the k order is permuted
// (fragment column t holds k = 2t, column t+4 holds 2t+1) -- a GEMM does not care -- so each pair
// of (c,p,q) offsets is one 8-byte load.
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
// Compile-time: C, H, W, M, K, MF, NF, ROWS (input rows a block stages).
#define HO (H - K + 1)
#define WO (W - K + 1)
#define HW (HO * WO)
#define KK (K * K)
#define KD (C * KK)
#define KDP ((KD + 7) / 8 * 8)
#define KSTEPS (KDP / 8)
#define BM (16 * MF)
#define BN (32 * NF)
#define PER_IMAGE ((HW + BN - 1) / BN)

// wp: float4 fragments [A_PARTS][gridDim.y][KSTEPS][MF][32 lanes], packed by the host.
extern "C" __global__ void __launch_bounds__(128)
conv_forward(const float* __restrict__ x, const float4* __restrict__ wp, float* __restrict__ y, int B)
{
    extern __shared__ float smem[];
    int* koff = reinterpret_cast<int*>(smem);  // [KDP], first: KDP is even, so xs stays 8-aligned
    float* xs = smem + KDP;                      // [C][ROWS][W]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const long long b = blockIdx.x / PER_IMAGE;
    const int hw0 = (int)(blockIdx.x % PER_IMAGE) * BN;
    const int row0 = hw0 / WO;  // the block's first output row is also its first input row
    const int rows = min(ROWS, H - row0);

    const float* xb = x + b * (C * H * W) + row0 * W;
    for (int i = tid; i < C * ROWS * W; i += 128) {
        const int c = i / (ROWS * W), rc = i % (ROWS * W);
        xs[i] = rc / W < rows ? STAGE(__ldg(xb + c * (H * W) + rc)) : 0.0f;
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

    const float4* wa = wp + (long long)blockIdx.y * (KSTEPS * MF * 32) + lane;
    const long long part = (long long)gridDim.y * (KSTEPS * MF * 32);
#pragma unroll 2
    for (int s = 0; s < KSTEPS; ++s) {
        float4 a[A_PARTS][MF];
        float bf[NF][2];
#pragma unroll
        for (int h = 0; h < A_PARTS; ++h)
#pragma unroll
            for (int i = 0; i < MF; ++i) a[h][i] = __ldg(wa + h * part + (s * MF + i) * 32);
        const int2 ko = *reinterpret_cast<const int2*>(koff + s * 8 + 2 * t);
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            bf[j][0] = xs[ko.x + noff[j]];
            bf[j][1] = xs[ko.y + noff[j]];
        }
        mma_step(acc, a, bf);
    }

    // Accumulator element e of tile (i, j): channel row g + 8*(e/2), pixel column 2t + e%2.
    const int m0 = blockIdx.y * BM;
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

from .base import Op, Support, Variant, blocks, check_inputs  # noqa: E402

MAX_MF = 4
ACCUMULATORS = 96  # MF*NF*4 registers per thread
MAX_SMEM = 96 * 1024


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

    def filter_parts(self, weights: np.ndarray) -> list[np.ndarray]:
        """The filter arrays the kernel multiplies: here, the filters rounded to TF32."""
        return [round_tf32(weights)]

    def prepare(self, shape, weights, epilogue=None, bias=None):
        import cupy

        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape)
        kernel = compiled.module.get_function("conv_forward")
        smem = smem_bytes(shape)
        kernel.max_dynamic_shared_size_bytes = smem
        mf = m_fragments(shape.M)
        wp = cupy.asarray(np.stack([pack_fragments(part, mf) for part in self.filter_parts(weights)]))
        per_image = blocks(shape.Ho * shape.Wo, 32 * n_fragments(shape))
        grid = (shape.B * per_image, blocks(shape.M, 16 * mf))
        batch = np.int32(shape.B)

        def launch(x, y):
            kernel(grid, (128,), (x, wp, y, batch), shared_mem=smem)

        return Op(launch, shape.output_shape, compiled.seconds)
