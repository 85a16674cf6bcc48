"""tiled: the textbook's shared-memory tiled convolution."""

SOURCE = r"""
// tiled: changes from naive -- a block computes a TILE x TILE patch of one output map (b, m).
// For each input channel it first copies the (TILE+K-1)^2 input patch and the K x K filter into
// shared memory; every input pixel is then read from global memory once per block instead of
// up to K*K times, and the inner loop reads only shared memory.
// Compile-time: TILE, K (they size the shared arrays). Run-time: the other sizes.
#define X_TILE (TILE + K - 1)

extern "C" __global__ void conv_forward(const float* x, const float* k, float* y,
                                        int C, int H, int W, int M, int tiles_w)
{
    __shared__ float xs[X_TILE][X_TILE];
    __shared__ float ks[K][K];
    const int Ho = H - K + 1;
    const int Wo = W - K + 1;
    const long long b = blockIdx.x;
    const int m = blockIdx.y;
    const int h0 = (blockIdx.z / tiles_w) * TILE;
    const int w0 = (blockIdx.z % tiles_w) * TILE;
    const int ty = threadIdx.y, tx = threadIdx.x;
    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float* xc = x + (b * C + c) * H * W;
        for (int i = ty; i < X_TILE; i += TILE)
            for (int j = tx; j < X_TILE; j += TILE) {
                const int hi = h0 + i, wj = w0 + j;
                xs[i][j] = (hi < H && wj < W) ? xc[hi * W + wj] : 0.0f;
            }
        for (int i = ty; i < K; i += TILE)
            for (int j = tx; j < K; j += TILE)
                ks[i][j] = k[((m * C + c) * K + i) * K + j];
        __syncthreads();
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xs[ty + p][tx + q] * ks[p][q];
        __syncthreads();
    }
    const int h = h0 + ty, w = w0 + tx;
    if (h < Ho && w < Wo)
        y[((b * M + m) * Ho + h) * Wo + w] = acc;
}
"""

import numpy as np

from .base import Op, Support, Variant, blocks, check_inputs, device_weights

MAX_GRID_YZ = 65535


def pick_tile(Ho: int, Wo: int) -> int:
    """The square tile (8..32) that wastes the fewest threads on this output; larger on ties."""
    def waste(t):
        return blocks(Ho, t) * blocks(Wo, t) * t * t
    return min(range(8, 33), key=lambda t: (waste(t), -t))


class Tiled(Variant):
    name = "tiled"
    summary = "shared-memory input and filter tiles (textbook tiled convolution)"
    source = SOURCE

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        tile = pick_tile(shape.Ho, shape.Wo)
        tiles = blocks(shape.Ho, tile) * blocks(shape.Wo, tile)
        if shape.M > MAX_GRID_YZ or tiles > MAX_GRID_YZ:
            return Support(False, f"grid needs M={shape.M} and {tiles} tiles <= {MAX_GRID_YZ}")
        if shape.B > 2**31 - 1:
            return Support(False, "batch exceeds the grid's x limit")
        return Support(True)

    def defines(self, shape, epilogue=None):
        return {"TILE": pick_tile(shape.Ho, shape.Wo), "K": shape.K}

    def launch_geometry(self, shape):
        tile = pick_tile(shape.Ho, shape.Wo)
        tiles_w = blocks(shape.Wo, tile)
        grid = (shape.B, shape.M, blocks(shape.Ho, tile) * tiles_w)
        return grid, (tile, tile), tiles_w

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape)
        kernel = compiled.module.get_function("conv_forward")
        w = device_weights(weights)
        grid, block, tiles_w = self.launch_geometry(shape)
        sizes = tuple(np.int32(v) for v in (shape.C, shape.H, shape.W, shape.M, tiles_w))

        def launch(x, y):
            kernel(grid, block, (x, w, y) + sizes)

        return Op(launch, shape.output_shape, compiled.seconds)
