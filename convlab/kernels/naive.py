"""naive: one thread per output element, every operand read from global memory.

The course's first GPU milestone and the baseline every other rung is measured against. Sizes
arrive as run-time arguments, so one compiled module serves every shape with the same stride,
padding, groups, bias and epilogue (those are compile-time switches).
"""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// naive: one thread per output element y[b][m][h][w]; x and k read straight from global
// memory on every use. Correct for any layer: stride, zero padding and groups are compile-time
// switches (STRIDE, PAD, GROUPS) that fold away for the course's plain layers, and the store
// adds the bias and applies the fused ReLU (HAS_BIAS, RELU). Fast for none of them.
""" + EPILOGUE_SOURCE + r"""
extern "C" __global__ void conv_forward(const float* x, const float* k, const float* bias, float* y,
                                        int B, int C, int H, int W, int M, int K)
{
    const int Ho = (H + 2 * PAD - K) / STRIDE + 1;
    const int Wo = (W + 2 * PAD - K) / STRIDE + 1;
    const long long total = (long long)B * M * Ho * Wo;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int w = (int)(i % Wo);
    const int h = (int)((i / Wo) % Ho);
    const int m = (int)((i / ((long long)Wo * Ho)) % M);
    const long long b = i / ((long long)Wo * Ho * M);
    const int Cg = C / GROUPS;
    const int c0 = GROUPS > 1 ? m / (M / GROUPS) * Cg : 0;  // the group's first input channel
    const int h0 = h * STRIDE - PAD, w0 = w * STRIDE - PAD;  // the window's top-left input pixel
    float acc = 0.0f;
    for (int c = 0; c < Cg; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q) {
                if (PAD > 0 && ((unsigned)(h0 + p) >= (unsigned)H || (unsigned)(w0 + q) >= (unsigned)W))
                    continue;  // a tap in the zero padding
                acc += x[((b * C + c0 + c) * H + h0 + p) * W + w0 + q] * k[((m * Cg + c) * K + p) * K + q];
            }
    acc = finish_output(acc, bias, m);
    y[i] = acc;
}
"""

import numpy as np  # noqa: E402

from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import RELU, Op, Variant, blocks, check_inputs, device_weights  # noqa: E402
from .general import device_bias, layer_defines  # noqa: E402

BLOCK = 256


class Naive(Variant):
    name = "naive"
    summary = "one thread per output, all operands from global memory"
    source = SOURCE
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def defines(self, shape, epilogue=None):
        return layer_defines(shape, epilogue)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        w = device_weights(weights)
        b = device_bias(bias)
        total = shape.B * shape.M * shape.Ho * shape.Wo
        sizes = tuple(np.int32(v) for v in (shape.B, shape.C, shape.H, shape.W, shape.M, shape.K))

        def launch(x, y):
            kernel((blocks(total, BLOCK),), (BLOCK,), (x, w, b, y) + sizes)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue)
