"""im2col: unroll the input into a patch matrix, then one cuBLAS GEMM per batch chunk."""

SOURCE = r"""
// im2col: changes from the direct kernels -- the textbook's "unroll + matrix multiply". A
// simple kernel copies every input patch into a column of X_unroll[b][(c,p,q)][(h,w)], then
// cuBLAS multiplies the filter matrix W[M][C*K*K] with it for all images of a chunk at once
// (a strided-batched GEMM whose result is y's layout, so no transpose follows). The GEMM is
// the fastest code on the GPU, but the unrolled matrix is K*K times the input, written and
// read again, so the workspace is bounded by doing the batch in chunks.
// Compile-time: C, H, W, K.
#define HO (H - K + 1)
#define WO (W - K + 1)
#define KD (C * K * K)

extern "C" __global__ void unroll(const float* __restrict__ x, float* __restrict__ xu, int images)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)images * KD * HO * WO) return;
    const int hw = (int)(i % (HO * WO));
    const int k = (int)((i / (HO * WO)) % KD);
    const long long b = i / ((long long)HO * WO * KD);
    const int c = k / (K * K), p = (k / K) % K, q = k % K;
    const int h = hw / WO, w = hw % WO;
    xu[i] = x[((b * C + c) * H + h + p) * W + w + q];
}
"""

import numpy as np

from .base import Op, Variant, blocks, check_inputs, device_weights

BLOCK = 256
WORKSPACE_BYTES = 256 * 1024 * 1024


def chunk_images(shape) -> int:
    per_image = 4 * shape.C * shape.K * shape.K * shape.Ho * shape.Wo
    return max(1, min(shape.B, WORKSPACE_BYTES // per_image))


class Im2col(Variant):
    name = "im2col"
    summary = "unroll kernel + cuBLAS strided-batched SGEMM, in batch chunks"
    source = SOURCE
    kernels = ("unroll",)

    def defines(self, shape, epilogue=None):
        return {"C": shape.C, "H": shape.H, "W": shape.W, "K": shape.K}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        import cupy

        check_inputs(self, shape, epilogue, bias)
        compiled = self.compile(shape)
        unroll = compiled.module.get_function("unroll")
        kd = shape.C * shape.K * shape.K
        hw = shape.Ho * shape.Wo
        w = device_weights(weights).reshape(shape.M, kd)
        chunk = chunk_images(shape)
        workspace = cupy.empty((chunk, kd, hw), dtype=cupy.float32)

        def launch(x, y):
            for b0 in range(0, shape.B, chunk):
                n = min(chunk, shape.B - b0)
                xu = workspace[:n]
                unroll((blocks(n * kd * hw, BLOCK),), (BLOCK,), (x[b0:b0 + n], xu, np.int32(n)))
                cupy.matmul(w, xu, out=y[b0:b0 + n].reshape(n, shape.M, hw))

        return Op(launch, shape.output_shape, compiled.seconds)
