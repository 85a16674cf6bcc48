"""im2col: unroll the input into a patch matrix, then cuBLAS GEMMs per batch chunk."""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// im2col: changes from the direct kernels -- the textbook's "unroll + matrix multiply". A
// simple kernel copies every input patch into a column of X_unroll[b][(c,p,q)][(h,w)], then
// cuBLAS multiplies the filter matrix W[M][C*K*K] with it for all images of a chunk at once
// (a batched GEMM whose result is y's layout, so no transpose follows). The GEMM is the fastest
// code on the GPU, but the unrolled matrix is K*K times the input, written and read again, so
// the workspace is bounded by doing the batch in chunks. General layers: the unroll applies the
// stride and writes zeros where a patch reaches into the padding; with G groups the weight
// matrix is block-diagonal, so the GEMM is G smaller ones per image (group g's M/G filters times
// its C/G*K*K rows of X_unroll), all in one batched call; a bias and the fused ReLU are one
// elementwise pass over the chunk's output after the GEMM.
// Compile-time: C, H, W, K, M, STRIDE, PAD, HAS_BIAS, RELU.
""" + EPILOGUE_SOURCE + r"""
#define HO ((H + 2 * PAD - K) / STRIDE + 1)
#define WO ((W + 2 * PAD - K) / STRIDE + 1)
#define KD (C * K * K)

extern "C" __global__ void unroll(const float* __restrict__ x, float* __restrict__ xu, int images)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)images * KD * HO * WO) return;
    const int hw = (int)(i % (HO * WO));
    const int k = (int)((i / (HO * WO)) % KD);
    const long long b = i / ((long long)HO * WO * KD);
    const int c = k / (K * K), p = (k / K) % K, q = k % K;
    const int h = hw / WO * STRIDE - PAD + p, w = hw % WO * STRIDE - PAD + q;
    const bool inside = PAD == 0 || ((unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W);
    xu[i] = inside ? x[((b * C + c) * H + h) * W + w] : 0.0f;
}

// The ladder's bias and ReLU (finish_output) over `images` outputs.
extern "C" __global__ void bias_relu(float* __restrict__ y, const float* __restrict__ bias,
                                     int images)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)images * M * HO * WO) return;
    y[i] = finish_output(y[i], bias, (int)((i / (HO * WO)) % M));
}
"""

import numpy as np  # noqa: E402

from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import RELU, Op, Variant, blocks, check_inputs, device_weights  # noqa: E402
from .general import device_bias  # noqa: E402

BLOCK = 256
WORKSPACE_BYTES = 256 * 1024 * 1024


def chunk_images(shape) -> int:
    per_image = 4 * shape.C * shape.K * shape.K * shape.Ho * shape.Wo
    return max(1, min(shape.B, WORKSPACE_BYTES // per_image))


class Im2col(Variant):
    name = "im2col"
    summary = "unroll kernel + cuBLAS batched SGEMM (per group), in batch chunks"
    source = SOURCE
    kernels = ("unroll", "bias_relu")
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def defines(self, shape, epilogue=None):
        return {"C": shape.C, "H": shape.H, "W": shape.W, "K": shape.K, "M": shape.M,
                "STRIDE": shape.stride, "PAD": shape.pad, "HAS_BIAS": int(shape.bias),
                "RELU": int(epilogue == RELU)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        import cupy

        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape, epilogue)
        unroll = compiled.module.get_function("unroll")
        finish = compiled.module.get_function("bias_relu") if shape.bias or epilogue == RELU else None
        G, kd = shape.groups, shape.C * shape.K * shape.K
        kdg, hw = kd // G, shape.Ho * shape.Wo
        w = device_weights(weights)
        if G == 1:  # one filter matrix times each image's X_unroll
            w, rows, outs = w.reshape(shape.M, kd), (kd, hw), (shape.M, hw)
        else:
            # Group g's filters (M/G x C/G*K*K) multiply rows g*kdg ... of each image's X_unroll
            # (ordered by input channel, so a group's rows are contiguous) into output channels
            # g*M/G ...: one batch of n*G GEMMs over views of the workspace and y, no copies.
            w, rows, outs = w.reshape(G, shape.Mg, kdg), (G, kdg, hw), (G, shape.Mg, hw)
        b = device_bias(bias)
        chunk = chunk_images(shape)
        workspace = cupy.empty((chunk, kd, hw), dtype=cupy.float32)

        def launch(x, y):
            for b0 in range(0, shape.B, chunk):
                n = min(chunk, shape.B - b0)
                xu = workspace[:n]
                unroll((blocks(n * kd * hw, BLOCK),), (BLOCK,), (x[b0:b0 + n], xu, np.int32(n)))
                out = y[b0:b0 + n]
                cupy.matmul(w, xu.reshape(n, *rows), out=out.reshape(n, *outs))
                if finish is not None:
                    finish((blocks(n * shape.M * hw, BLOCK),), (BLOCK,), (out, b, np.int32(n)))

        # CuPy refuses cuBLAS calls during stream capture: no CUDA graph holds this op.
        return Op(launch, shape.output_shape, compiled.seconds, epilogue, capturable=False)
