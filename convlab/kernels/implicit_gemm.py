"""implicit-gemm: the im2col GEMM computed tile by tile in shared memory, with no workspace."""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// implicit-gemm: changes from im2col -- the same GEMM, out[m][n] = sum_k W[m][k] * X[k][n] with
// n = (b, h, w) and k = (c, p, q), but the unrolled matrix X is never written: each block
// gathers the BK x BN slice of X it needs straight from the input into shared memory, next to
// a BK x BM slice of W, and multiplies them there. That removes the K*K-times-larger workspace
// round trip through device memory and the separate unroll launch. Register blocking: each of
// the 256 threads (16 x 16) keeps a TM x 8 tile of the output in registers, reading A as one
// TM-wide vector and B as two float4 per k step, so every shared-memory load feeds several FMAs.
// General layers: each group is its own GEMM (M/G channels, k over its C/G*K*K taps); a block's
// BM channels stay inside one group (grid.y walks the groups' channel blocks, the last block of
// a group is clamped to it). The gather applies the stride and reads zero in the padding; the
// store adds the bias and the fused ReLU.
// Compile-time: C, H, W, M, K, TM (BM = 16*TM channels per block), STRIDE, PAD, GROUPS,
// HAS_BIAS, RELU.
#define HO ((H + 2 * PAD - K) / STRIDE + 1)
#define WO ((W + 2 * PAD - K) / STRIDE + 1)
#define HW (HO * WO)
#define KK (K * K)
#define CG (C / GROUPS)
#define MG (M / GROUPS)
#define KD (CG * KK)
#define BM (16 * TM)
#define MBLOCKS ((MG + BM - 1) / BM)  // channel blocks per group
#define BN 128
#define BK 8
""" + EPILOGUE_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(256)
conv_forward(const float* __restrict__ x, const float* __restrict__ w,
             const float* __restrict__ bias, float* __restrict__ y, int B)
{
    __shared__ __align__(16) float As[BK][BM];
    __shared__ __align__(16) float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    const long long N = (long long)B * HW;
    const long long n0 = (long long)blockIdx.x * BN;
    // The block's group, its first channel, and the end of its group's channels.
    const int group = GROUPS > 1 ? blockIdx.y / MBLOCKS : 0;
    const int m0 = GROUPS > 1 ? group * MG + (blockIdx.y % MBLOCKS) * BM : blockIdx.y * BM;
    const int mend = group * MG + MG;

    // The column of X this thread gathers: fixed for the whole k loop.
    const int nn = tid % BN;
    long long n = n0 + nn;
    if (n >= N) n = N - 1;  // a valid address; the result for it is never stored
    const long long bimg = n / HW;
    const int hw = (int)(n % HW);
    const int hi0 = (hw / WO) * STRIDE - PAD, wi0 = (hw % WO) * STRIDE - PAD;
    const float* ximg = x + bimg * (C * H * W) + group * (CG * H * W);
#if PAD > 0
    // With padding the window's first pixel can lie before the channel plane: keep it an offset.
    const int xoff = hi0 * W + wi0;
#else
    const float* xcol = ximg + hi0 * W + wi0;
#endif

    float acc[TM][8];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < KD; k0 += BK) {
#pragma unroll
        for (int i = 0; i < BK * BN / 256; ++i) {
            const int kk = tid / BN + i * (256 / BN);
            const int k = k0 + kk;
            float v = 0.0f;
            if (k < KD) {
                const int c = k / KK, p = (k % KK) / K, q = k % K;
#if PAD > 0
                if ((unsigned)(hi0 + p) < (unsigned)H && (unsigned)(wi0 + q) < (unsigned)W)
                    v = __ldg(ximg + (xoff + c * (H * W) + p * W + q));
#else
                v = __ldg(xcol + c * (H * W) + p * W + q);
#endif
            }
            Bs[kk][nn] = v;
        }
        for (int i = tid; i < BK * BM; i += 256) {
            const int kk = i / BM, mm = i % BM;
            As[kk][mm] = (m0 + mm < mend && k0 + kk < KD) ? __ldg(w + (m0 + mm) * KD + k0 + kk) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][ty * TM + i];
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4 + 64]);
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const long long nj = n0 + tx * 4 + (j % 4) + 64 * (j / 4);
        if (nj >= N) continue;
        float* yn = y + (nj / HW) * ((long long)M * HW) + (nj % HW);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + ty * TM + i;
            if (m < mend) yn[(long long)m * HW] = finish_output(acc[i][j], bias, m);
        }
    }
}
"""

import numpy as np  # noqa: E402

from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import RELU, Op, Support, Variant, blocks, check_inputs, device_weights  # noqa: E402
from .general import device_bias, layer_defines  # noqa: E402

BN = 128
MAX_GRID_Y = 65535


def rows_per_thread(Mg: int) -> int:
    """TM: the smallest of 1, 2, 4 whose 16*TM-channel block covers a group's Mg channels (4
    beyond 32 channels)."""
    for tm in (1, 2):
        if 16 * tm >= Mg:
            return tm
    return 4


def channel_blocks(shape) -> int:
    """grid.y: every group's channels in blocks of BM, none straddling two groups."""
    return shape.groups * blocks(shape.Mg, 16 * rows_per_thread(shape.Mg))


class ImplicitGemm(Variant):
    name = "implicit-gemm"
    summary = "im2col fused into a shared-memory tiled GEMM with register blocking, no workspace"
    source = SOURCE
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        if channel_blocks(shape) > MAX_GRID_Y:
            return Support(False, f"{channel_blocks(shape)} channel blocks exceed the grid's "
                                  f"y limit {MAX_GRID_Y}")
        return Support(True)

    def defines(self, shape, epilogue=None):
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
                "TM": rows_per_thread(shape.Mg), **layer_defines(shape, epilogue)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        w = device_weights(weights)
        b = device_bias(bias)
        grid = (blocks(shape.B * shape.Ho * shape.Wo, BN), channel_blocks(shape))
        batch = np.int32(shape.B)

        def launch(x, y):
            kernel(grid, (256,), (x, w, b, y, batch))

        return Op(launch, shape.output_shape, compiled.seconds, epilogue)
