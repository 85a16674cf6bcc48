"""The float64 reference of local response normalisation (alone and followed by a max-pool) and
the error bound of the float32 kernels that compute it (ops.lrn): which of the two power paths
a beta takes, and the roundings along each."""

from __future__ import annotations

import numpy as np

from .reference import lrn as lrn_float, max_pool
from .verify import ALLOWED_ULPS, Reference, magnitude_for_units


def three_quarters(beta: float) -> bool:
    """Whether the kernel takes the beta = 0.75 path (rsqrt) rather than exp2f(log2f)."""
    return beta == 0.75


def window_sums(x64: np.ndarray, size: int) -> np.ndarray:
    """S[b, c, h, w]: the sum of x^2 over channels c-before ... c-before+size-1, clipped."""
    before = (size - 1) // 2
    padded = np.pad(np.square(x64), ((0, 0), (before, size - 1 - before), (0, 0), (0, 0)))
    return np.lib.stride_tricks.sliding_window_view(padded, size, axis=1).sum(axis=-1)


def lrn_error_units(denominator: np.ndarray, size: int, beta: float) -> tuple[float, np.ndarray]:
    """The float32 LRN's relative error in units of u, as (the window sum's factor, the rest).

    The kernel computes S (the window's sum of squares, FMAs of non-negative terms: no
    cancellation), d = fmaf(alpha/size, S, k), p ~ d^-beta and y = x * p.
    - S: relative error LAMBDA*sqrt(size)*u in the probabilistic law verify.py uses (for
      size <= 64 that also exceeds the worst case, size*u).
    - d: the roundings of alpha/size, of k and of the FMA, each relative to a part of d or to
      d itself: 2u more at most. A relative error e of d (S's included) becomes beta*e in p.
    - p for beta = 0.75: r = rsqrt(d), q = rsqrt(r), each within ALLOWED_ULPS["rsqrtf"] ulps
      (2u each); p = r*(r*q), two roundings. p is r^2 * r^-1/2 = r^1.5, so r's error counts
      1.5 times: 1.5*e_r + e_q + 2u. The exponent is exact (no float32 beta).
    - p for other betas: L = log2f(d) (ALLOWED_ULPS["log2f"] ulps), t = fl(-beta)*L (-beta
      rounded to float32, the product rounded: u each), p = exp2f(t) (ALLOWED_ULPS["exp2f"]
      ulps). A relative error e of t is an error e*|t| in the exponent, a relative error
      ln2*|t|*e = beta*|ln d|*e of p: beta*|ln d|*(2 + 2*ALLOWED log2f)*u, plus exp2f's own.
    - y: one rounding.
    So |y - ref| / |ref| <= beta*LAMBDA*sqrt(size)*u + (2*beta + the pow term + 1)*u, to first
    order (the second-order terms are below 1e-10 of the first).
    """
    if three_quarters(beta):
        rsqrt_units = 2 * ALLOWED_ULPS["rsqrtf"]
        pow_units = 1.5 * rsqrt_units + rsqrt_units + 2 + np.zeros_like(denominator)
    else:
        pow_units = (beta * np.abs(np.log(denominator)) * (2 + 2 * ALLOWED_ULPS["log2f"])
                     + 2 * ALLOWED_ULPS["exp2f"])
    return beta, 2 * beta + pow_units + 1


def _lrn_values_and_magnitude(x: np.ndarray, size: int, alpha: float, beta: float, k: float):
    x64 = np.asarray(x, dtype=np.float64)
    values = lrn_float(x64, size, alpha, beta, k)
    d = k + (alpha / size) * window_sums(x64, size)
    sum_factor, rest = lrn_error_units(d, size, beta)
    # Reference.bound is LAMBDA*sqrt(size)*u*magnitude, so
    # magnitude = |y| * (beta + rest / (LAMBDA*sqrt(size))).
    magnitude = np.abs(values) * (sum_factor + magnitude_for_units(rest, size))
    return values, magnitude


def reference_lrn(x: np.ndarray, size: int, alpha: float, beta: float, k: float) -> Reference:
    """The float64 LRN and its bound (lrn_error_units derives it), n = size."""
    values, magnitude = _lrn_values_and_magnitude(x, size, alpha, beta, k)
    return Reference(values, magnitude, size)


def reference_lrn_max_pool(x: np.ndarray, size: int, alpha: float, beta: float, k: float,
                           pool_size: int, pool_stride: int) -> Reference:
    """The float64 LRN + max-pool. max is 1-Lipschitz in each argument: the pooled value is
    off by no more than the largest error in its window, so the pooled bound is the max of the
    window's LRN bounds (the bound grows with the magnitude, so: the max-pooled magnitude)."""
    values, magnitude = _lrn_values_and_magnitude(x, size, alpha, beta, k)
    return Reference(max_pool(values, pool_size, pool_stride),
                     max_pool(magnitude, pool_size, pool_stride), size)
