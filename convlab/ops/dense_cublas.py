"""Fully connected layers through cuBLAS: the reference row our own SGEMM is measured against."""

from .base import ACTIVATION_SOURCE

SOURCE = r"""
// bias_activation: y[m][n] = act(y[m][n] + bias[n]) in place, after cuBLAS's SGEMM wrote
// x @ w.T into y. cuBLAS has no bias or activation epilogue in its plain GEMM, so this is the
// second pass over y (M*N floats, small next to the GEMM) that a library call costs and our
// fused epilogue avoids. One thread per element, 64-bit index. Compile-time: N, ACT.
""" + ACTIVATION_SOURCE + r"""
extern "C" __global__ void __launch_bounds__(256)
bias_activation(float* __restrict__ y, const float* __restrict__ bias, long long total)
{
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < total) y[i] = activate(y[i] + __ldg(bias + i % N));
}
"""

import numpy as np  # noqa: E402

from .base import KernelSpec, LayerOp, ceil_div, check_activation, compile_specs, spec  # noqa: E402
from .dense import check_dense_weights, dense_name  # noqa: E402

BLOCK = 256


def bias_activation_kernel(batch: int, outputs: int, activation: str | None) -> KernelSpec:
    defines = {"N": outputs, "ACT": check_activation(activation)}
    return spec("ops.dense_cublas", "bias_activation", SOURCE, defines,
                (ceil_div(batch * outputs, BLOCK),), BLOCK)


def prepare_dense_cublas(batch: int, weight: np.ndarray, bias: np.ndarray,
                         activation: str | None = None) -> LayerOp:
    """y = activation(x @ weight.T + bias) with cuBLAS's SGEMM (cupy.cublas.gemm: FP32
    arithmetic, the handle's default math mode, no TF32) writing straight into y (a C-ordered
    output is computed as y.T = w @ x.T, no temporary), then the bias and activation kernel."""
    import cupy
    from cupy import cublas

    inputs, outputs = check_dense_weights(weight, bias)
    kernel_spec = bias_activation_kernel(batch, outputs, activation)
    compiled = compile_specs([kernel_spec])
    _, epilogue = compiled.kernels[0]
    w = cupy.asarray(np.ascontiguousarray(weight, dtype=np.float32))
    b = cupy.asarray(np.ascontiguousarray(bias, dtype=np.float32))
    total = np.int64(batch * outputs)

    def launch(x, y):
        cublas.gemm("N", "T", x, w, out=y)
        epilogue(kernel_spec.grid, kernel_spec.block, (y, b, total))

    return LayerOp(f"{dense_name(inputs, outputs, activation)} (cuBLAS)", "fc", "bias_activation",
                   launch, (batch, outputs), compiled.seconds)
