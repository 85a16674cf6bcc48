"""Row softmax, numerically stable: max, sum of exponentials, normalise."""

SOURCE = r"""
// softmax: y[r][i] = exp(x[r][i] - max_j x[r][j]) / sum_j exp(x[r][j] - max_j x[r][j]).
// Subtracting the row's max first keeps every exponent <= 0: no overflow, and the sum is at
// least 1. One warp per row (the class layers have 10 to 1,000 outputs, a few per lane): lanes
// stride the row, so every pass reads 32 consecutive floats at a time, and each reduction is
// five shuffles with no shared memory and no barrier. Three passes: the max; the exponentials,
// stored to y and summed; y divided by the sum (a lane reads back only what it wrote). The
// second and third passes hit the L1/L2 copy of a row the first pass brought in. expf (2 ulps)
// and an IEEE division, not the fast intrinsics: the bound counts their errors.
// Compile-time: N (row length), WARPS (rows per block). Row offsets are 64-bit.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows)
{
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together: the shuffles below see full warps
    const float* __restrict__ xr = x + (long long)row * N;
    float* __restrict__ yr = y + (long long)row * N;
    float top = __int_as_float(0xff800000);  // -infinity
    for (int i = lane; i < N; i += 32) top = fmaxf(top, xr[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
    float sum = 0.0f;
    for (int i = lane; i < N; i += 32) {
        const float e = expf(xr[i] - top);
        yr[i] = e;
        sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int i = lane; i < N; i += 32) yr[i] = yr[i] / sum;
}
"""

import numpy as np  # noqa: E402

from ..oracle.reference import softmax  # noqa: E402
from ..oracle.verify import ALLOWED_ULPS, Reference, magnitude_for_units  # noqa: E402
from .base import KernelSpec, LayerOp, ceil_div, compile_specs, spec  # noqa: E402

WARPS = 8


def softmax_kernel(batch: int, n: int) -> KernelSpec:
    if batch < 1 or n < 1:
        raise ValueError(f"softmax needs a positive batch and row length, got {batch} x {n}")
    if batch > 2 ** 31 - 1:
        raise ValueError(f"softmax counts rows in 32 bits; {batch} rows are too many")
    return spec("ops.softmax", "softmax_rows", SOURCE, {"N": n, "WARPS": WARPS},
                (ceil_div(batch, WARPS),), WARPS * 32)


def prepare_softmax(batch: int, n: int) -> LayerOp:
    """Row softmax of x (batch, n) into y (batch, n)."""
    kernel_spec = softmax_kernel(batch, n)
    compiled = compile_specs([kernel_spec])
    _, kernel = compiled.kernels[0]
    rows = np.int32(batch)

    def launch(x, y):
        kernel(kernel_spec.grid, kernel_spec.block, (x, y, rows))

    return LayerOp(f"softmax {n}", "softmax", "softmax_rows", launch, (batch, n),
                   compiled.seconds)


def softmax_error_units(z: np.ndarray) -> np.ndarray:
    """Relative error of each float32 softmax output beyond its sum's share, in units of u.

    With d_i = z_i - max (float64), the kernel computes e_i = expf(fl(d_i)), s = sum e_j and
    y_i = e_i / s:
    - fl(d_i) = d_i(1 + delta), |delta| <= u, so exp changes by a factor exp(d_i*delta):
      relative |d_i|*u; expf adds ALLOWED_ULPS ulps (2u each): rel(e_i) <= (|d_i| + 8)*u.
    - s: the sum of n positive terms has relative error LAMBDA*sqrt(n)*u (verify.py's law; the
      share Reference.bound provides), plus its terms' errors, a weighted mean:
      sum_j e_j*(|d_j| + 8)*u / s.
    - the division rounds once: u.
    So rel(y_i) <= LAMBDA*sqrt(n)*u + (|d_i| + mean_j |d_j| + 2*8 + 1)*u, first order; this
    returns the second term over u.
    """
    d = z - z.max(axis=1, keepdims=True)
    e = np.exp(d)
    expf_units = 2 * ALLOWED_ULPS["expf"]
    weighted = (e * np.abs(d)).sum(axis=1, keepdims=True) / e.sum(axis=1, keepdims=True)
    return np.abs(d) + weighted + 2 * expf_units + 1


def reference_softmax(z: np.ndarray) -> Reference:
    """The float64 softmax and its bound (softmax_error_units derives it), n = row length."""
    z64 = np.asarray(z, dtype=np.float64)
    values = softmax(z64)
    n = z64.shape[1]
    magnitude = values * (1.0 + magnitude_for_units(softmax_error_units(z64), n))
    return Reference(values, magnitude, n)
