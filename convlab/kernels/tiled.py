"""tiled: the textbook's shared-memory tiled convolution."""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// tiled: changes from naive -- a block computes a TILE x TILE patch of one output map (b, m).
// For each input channel it first copies the input patch those outputs read and the K x K filter
// into shared memory; every input pixel is then read from global memory once per block instead of
// up to K*K times, and the inner loop reads only shared memory. General layers: with stride S the
// patch is (TILE-1)*S+K wide, zero padding is filled in while copying, a group's channels are an
// offset, and the store adds the bias and the fused ReLU; for plain layers all of it folds away.
// Compile-time: TILE, K (they size the shared arrays), STRIDE, PAD, GROUPS, HAS_BIAS, RELU.
// Run-time: the other sizes.
#define X_TILE ((TILE - 1) * STRIDE + K)
""" + EPILOGUE_SOURCE + r"""
extern "C" __global__ void conv_forward(const float* x, const float* k, const float* bias, float* y,
                                        int C, int H, int W, int M, int tiles_w)
{
    __shared__ float xs[X_TILE][X_TILE];
    __shared__ float ks[K][K];
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
        for (int i = ty; i < K; i += TILE)
            for (int j = tx; j < K; j += TILE)
                ks[i][j] = k[((m * Cg + c) * K + i) * K + j];
        __syncthreads();
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xs[ty * STRIDE + p][tx * STRIDE + q] * ks[p][q];
        __syncthreads();
    }
    const int h = h0 + ty, w = w0 + tx;
    if (h < Ho && w < Wo)
        y[((b * M + m) * Ho + h) * Wo + w] = finish_output(acc, bias, m);
}
"""

import numpy as np  # noqa: E402

from ..gpu.hardware import H100  # noqa: E402
from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import RELU, Op, Support, Variant, blocks, check_inputs, device_weights  # noqa: E402
from .general import device_bias, layer_defines  # noqa: E402

MAX_GRID_YZ = 65535
STATIC_SMEM = H100.limits.shared_per_block_default  # statically sized __shared__ arrays' limit


def tile_smem_bytes(tile: int, shape) -> int:
    side = (tile - 1) * shape.stride + shape.K
    return 4 * (side * side + shape.K * shape.K)


def pick_tile(shape) -> int:
    """The square tile (8..32) that wastes the fewest threads on this output; larger on ties.
    Only tiles whose input patch fits in shared memory qualify (a large stride or kernel grows
    the patch); 0 when none does."""
    def waste(t):
        return blocks(shape.Ho, t) * blocks(shape.Wo, t) * t * t
    fitting = [t for t in range(8, 33) if tile_smem_bytes(t, shape) <= STATIC_SMEM]
    return min(fitting, key=lambda t: (waste(t), -t)) if fitting else 0


class Tiled(Variant):
    name = "tiled"
    summary = "shared-memory input and filter tiles (textbook tiled convolution)"
    source = SOURCE
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        tile = pick_tile(shape)
        if not tile:
            return Support(False, f"an 8x8 output tile's input patch and filter need "
                                  f"{tile_smem_bytes(8, shape)} bytes of shared memory; "
                                  f"static shared memory holds {STATIC_SMEM}")
        tiles = blocks(shape.Ho, tile) * blocks(shape.Wo, tile)
        if shape.M > MAX_GRID_YZ or tiles > MAX_GRID_YZ:
            return Support(False, f"grid needs M={shape.M} and {tiles} tiles <= {MAX_GRID_YZ}")
        if shape.B > 2**31 - 1:
            return Support(False, "batch exceeds the grid's x limit")
        return Support(True)

    def defines(self, shape, epilogue=None):
        return {"TILE": pick_tile(shape), "K": shape.K, **layer_defines(shape, epilogue)}

    def launch_geometry(self, shape):
        tile = pick_tile(shape)
        tiles_w = blocks(shape.Wo, tile)
        grid = (shape.B, shape.M, blocks(shape.Ho, tile) * tiles_w)
        return grid, (tile, tile), tiles_w

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        w = device_weights(weights)
        b = device_bias(bias)
        grid, block, tiles_w = self.launch_geometry(shape)
        sizes = tuple(np.int32(v) for v in (shape.C, shape.H, shape.W, shape.M, tiles_w))

        def launch(x, y):
            kernel(grid, block, (x, w, b, y) + sizes)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue)
