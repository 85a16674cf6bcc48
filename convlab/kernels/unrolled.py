"""unrolled: every size a compile-time constant, loops unrolled, warps kept full."""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// unrolled: changes from constant -- the JIT compiles one kernel per layer shape, so C, H, W,
// M and K are constants: every index is folded to an immediate offset, the c/p/q loops unroll
// completely (no loop counters, no bounds arithmetic), and x is read through the read-only
// path (__restrict__ + __ldg). The 2-D tiles are replaced by the course report's 1-D mapping:
// 1024-thread blocks walk y in memory order, so a warp is always 32 consecutive outputs even
// when the image width (24, 42, 15 here) is no multiple of 32; the tiled kernels leave up to
// half of each warp idle on such widths. Filters stay in __constant__ memory. General layers:
// stride and groups fold into the constant offsets, zero padding becomes a predicate per tap
// (only compiled in when PAD > 0), and the store adds the bias and the fused ReLU.
#define HO ((H + 2 * PAD - K) / STRIDE + 1)
#define WO ((W + 2 * PAD - K) / STRIDE + 1)
#define CG (C / GROUPS)
#define MG (M / GROUPS)

__constant__ float kc[M * CG * K * K];
""" + EPILOGUE_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(BLOCK)
conv_forward(const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ y,
             int B)
{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= (long long)B * M * HO * WO) return;
    const int w = (int)(i % WO);
    const int h = (int)((i / WO) % HO);
    const int m = (int)((i / (WO * HO)) % M);
    const long long b = i / ((long long)WO * HO * M);
    const int c0 = GROUPS > 1 ? m / MG * CG : 0;  // the group's first input channel
    const int hi0 = h * STRIDE - PAD, wi0 = w * STRIDE - PAD;  // the window's top-left input pixel
#if PAD > 0
    // The window may start above or left of the image: offsets stay relative to the channel
    // plane, and a tap is loaded only where it lies inside the image (zero padding elsewhere).
    const float* xb = x + b * (C * H * W) + c0 * (H * W);
    const int pix = hi0 * W + wi0;
#else
    const float* xb = x + b * (C * H * W) + c0 * (H * W) + hi0 * W + wi0;
#endif
    const float* km = kc + m * (CG * K * K);
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < CG; ++c)
#pragma unroll
        for (int p = 0; p < K; ++p)
#pragma unroll
            for (int q = 0; q < K; ++q) {
#if PAD > 0
                const bool inside = (unsigned)(hi0 + p) < (unsigned)H && (unsigned)(wi0 + q) < (unsigned)W;
                const float v = inside ? __ldg(xb + (pix + (c * H + p) * W + q)) : 0.0f;
#else
                const float v = __ldg(xb + (c * H + p) * W + q);
#endif
                acc = fmaf(v, km[(c * K + p) * K + q], acc);
            }
    y[i] = finish_output(acc, bias, m);
}
"""

import numpy as np  # noqa: E402

from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import RELU, ConstantWeights, Op, Variant, blocks, check_inputs  # noqa: E402
from .constant import fits_constant  # noqa: E402
from .general import device_bias, layer_defines  # noqa: E402

BLOCK = 1024


class Unrolled(Variant):
    name = "unrolled"
    summary = "shape-specialised by the JIT: constant sizes, unrolled loops, 1-D full warps"
    source = SOURCE
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def supports(self, shape):
        base = super().supports(shape)
        return base if not base else fits_constant(shape)

    def defines(self, shape, epilogue=None):
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
                "BLOCK": BLOCK, **layer_defines(shape, epilogue)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        constants = ConstantWeights(compiled.module, "kc", weights)
        b = device_bias(bias)
        total = shape.B * shape.M * shape.Ho * shape.Wo
        grid = (blocks(total, BLOCK),)
        batch = np.int32(shape.B)

        def launch(x, y):
            constants.ensure()
            kernel(grid, (BLOCK,), (x, b, y, batch))

        return Op(launch, shape.output_shape, compiled.seconds, epilogue)
