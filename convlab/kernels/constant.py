"""constant: the tiled kernel with its filters in __constant__ memory."""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// constant: changes from tiled -- the filters live in __constant__ memory instead of being
// copied into shared memory per block and channel. All threads of a block use the same filter
// element at the same time, which is exactly the broadcast the constant cache serves in one
// transaction; the filter copy and its share of shared-memory traffic disappear. General layers
// as in tiled (stride, zero padding, groups, bias + ReLU at the store, folded away when plain).
// Compile-time: TILE, K, KC_SIZE (= M*C/GROUPS*K*K floats, at most 16384 = 64 KB), STRIDE, PAD,
// GROUPS, HAS_BIAS, RELU.
#define X_TILE ((TILE - 1) * STRIDE + K)

__constant__ float kc[KC_SIZE];
""" + EPILOGUE_SOURCE + r"""
extern "C" __global__ void conv_forward(const float* x, const float* bias, float* y,
                                        int C, int H, int W, int M, int tiles_w)
{
    __shared__ float xs[X_TILE][X_TILE];
    const int Ho = (H + 2 * PAD - K) / STRIDE + 1;
    const int Wo = (W + 2 * PAD - K) / STRIDE + 1;
    const int Cg = C / GROUPS;
    const long long b = blockIdx.x;
    const int m = blockIdx.y;
    const int c0 = GROUPS > 1 ? m / (M / GROUPS) * Cg : 0;  // the group's first input channel
    const int h0 = (blockIdx.z / tiles_w) * TILE;
    const int w0 = (blockIdx.z % tiles_w) * TILE;
    const int hi0 = h0 * STRIDE - PAD, wi0 = w0 * STRIDE - PAD;  // the patch's first input pixel
    const int ty = threadIdx.y, tx = threadIdx.x;
    float acc = 0.0f;
    for (int c = 0; c < Cg; ++c) {
        const float* xc = x + (b * C + c0 + c) * H * W;
        for (int i = ty; i < X_TILE; i += TILE)
            for (int j = tx; j < X_TILE; j += TILE) {
                const int hi = hi0 + i, wj = wi0 + j;
                const bool inside = hi < H && wj < W && (PAD == 0 || (hi >= 0 && wj >= 0));
                xs[i][j] = inside ? xc[hi * W + wj] : 0.0f;
            }
        __syncthreads();
        const float* kmc = kc + (m * Cg + c) * K * K;
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xs[ty * STRIDE + p][tx * STRIDE + q] * kmc[p * K + q];
        __syncthreads();
    }
    const int h = h0 + ty, w = w0 + tx;
    if (h < Ho && w < Wo)
        y[((b * M + m) * Ho + h) * Wo + w] = finish_output(acc, bias, m);
}
"""

import numpy as np  # noqa: E402

from .base import ConstantWeights, Op, Support, check_inputs  # noqa: E402
from .general import device_bias, layer_defines  # noqa: E402
from .tiled import Tiled, pick_tile  # noqa: E402

CONSTANT_FLOATS = 16384  # the 64 KB __constant__ bank a module may use


def fits_constant(shape) -> Support:
    floats = shape.M * shape.Cg * shape.K * shape.K
    if floats > CONSTANT_FLOATS:
        return Support(False, f"weights need {4 * floats} bytes; __constant__ memory holds "
                              f"{4 * CONSTANT_FLOATS}")
    return Support(True)


class Constant(Tiled):
    name = "constant"
    summary = "tiled, with the filters in __constant__ memory"
    source = SOURCE

    def supports(self, shape):
        base = super().supports(shape)
        return base if not base else fits_constant(shape)

    def defines(self, shape, epilogue=None):
        return {"TILE": pick_tile(shape), "K": shape.K,
                "KC_SIZE": shape.M * shape.Cg * shape.K * shape.K, **layer_defines(shape, epilogue)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        constants = ConstantWeights(compiled.module, "kc", weights)
        b = device_bias(bias)
        grid, block, tiles_w = self.launch_geometry(shape)
        sizes = tuple(np.int32(v) for v in (shape.C, shape.H, shape.W, shape.M, tiles_w))

        def launch(x, y):
            constants.ensure()
            kernel(grid, block, (x, b, y) + sizes)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue)
