"""naive: one thread per output element, every operand read from global memory.

The course's first GPU milestone and the baseline every other rung is measured against. Sizes
arrive as run-time arguments, so one compiled module serves every shape.
"""

SOURCE = r"""
// naive: one thread per output element y[b][m][h][w]; x and k read straight from global
// memory on every use. Correct for any stride-1, unpadded shape; fast for none of them.
extern "C" __global__ void conv_forward(const float* x, const float* k, float* y,
                                        int B, int C, int H, int W, int M, int K)
{
    const int Ho = H - K + 1;
    const int Wo = W - K + 1;
    const long long total = (long long)B * M * Ho * Wo;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int w = (int)(i % Wo);
    const int h = (int)((i / Wo) % Ho);
    const int m = (int)((i / ((long long)Wo * Ho)) % M);
    const long long b = i / ((long long)Wo * Ho * M);
    float acc = 0.0f;
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += x[((b * C + c) * H + h + p) * W + w + q] * k[((m * C + c) * K + p) * K + q];
    y[i] = acc;
}
"""

import numpy as np

from .base import Op, Variant, blocks, check_inputs, device_weights

BLOCK = 256


class Naive(Variant):
    name = "naive"
    summary = "one thread per output, all operands from global memory"
    source = SOURCE

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape)
        kernel = compiled.module.get_function("conv_forward")
        w = device_weights(weights)
        total = shape.B * shape.M * shape.Ho * shape.Wo
        sizes = tuple(np.int32(v) for v in (shape.B, shape.C, shape.H, shape.W, shape.M, shape.K))

        def launch(x, y):
            kernel((blocks(total, BLOCK),), (BLOCK,), (x, w, y) + sizes)

        return Op(launch, shape.output_shape, compiled.seconds)
