"""Checking a variant's output against the float64 reference, and saying precisely how it fails.

The test is a bound per output element from floating-point error analysis, not one tolerance
for a whole tensor:

    |y - ref| <= LAMBDA * sqrt(n) * u * (sum_i |x_i * w_i| + FLOOR_SHARE * its mean over the
                                          layer)   (+ n * the smallest normal float)

n is the number of terms summed into the element (C/G*K*K, plus one for a bias), u the unit
roundoff of the precision the variant computes in, and the sum runs over the element's own
products, so the bound follows the element's scale and its cancellation. Why sqrt(n): the
worst-case bound for any summation order is gamma_n = n*u/(1 - n*u) times the same sum, but
it is reached only if every rounding error has the same sign and maximal size. Rounding to
nearest makes errors that behave like independent, zero-mean random variables, and then the
error grows like sqrt(n)*u with overwhelming probability (Higham & Mary, "A new approach to
probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019): with LAMBDA = 8 the chance
that a correct element exceeds the bound is below 2*n*exp(-LAMBDA**2/2) ~ 3e-14 * n. Measured:
sequential float32 sums of n = 25 ... 20,000 products of same-sign or mixed-sign data stay
below 1.2 * sqrt(n) * u * sum|x*w| (results/NOTES.md), so LAMBDA = 8 leaves a wide margin.
A bug is not a rounding error: a skipped or wrong term is off by about sum|x*w| / n, which is
1 / (LAMBDA * n**1.5 * u) times the bound: 6.7x at n = 4,608 in float32, and more at the
elements where that term is large. A worst-case bound (c = n) would stop seeing a single wrong
term near n = 4,000; this one sees it up to n ~ 16,000.

What the sqrt(n) law assumes, and where it fails: errors that do not average out. Tensor cores
that truncate (round toward zero) inside their accumulation make errors of one sign; on data
whose products all have one sign the error then grows like n*u, and a long enough reduction
exceeds the bound. That is a property of the arithmetic, and the rule reports it.

Reduced precision (tf32, fp16: u = 2^-11; bf16: 2^-8) rounds each input once, an error per
product rather than per partial sum: about u * sqrt(n) * rms|x*w| in all, against a bound of
LAMBDA * sqrt(n) * u * n * mean|x*w|. So the bound is looser for those variants by about n
than it is for fp32 (it still catches gross errors, less sharply), and, the other way round,
the fp32 bound cannot tell TF32 arithmetic from FP32 once n exceeds about 2^13 / LAMBDA ~ 1,000
terms: on the course's layers (n = 25 ... 588) it can, on AlexNet's (n = 363 ... 3,456) only on
conv1. The form sum|x*w| is what the issue asked for; a tighter rule would need the
order-dependent partial sums of the kernel under test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..gpu.elements import BFLOAT16, FLOAT16, poison_value, values
from .reference import conv2d_with_magnitude, conv_shape_args, max_pool, relu

UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
LAMBDA = 8.0
# CUDA's documented maximum errors (CUDA C++ Programming Guide, Mathematical Functions,
# single precision, default flags: no fast math) are 2 ulps for expf, tanhf, exp2f and rsqrtf
# and 1 for log2f. Those figures come from extensive but not exhaustive tests, so the bounds
# allow twice as many. One ulp of a normal float v is at most 2^-23 |v| = 2u|v|.
ALLOWED_ULPS = {"expf": 4, "tanhf": 4, "exp2f": 4, "rsqrtf": 4, "log2f": 2}
# Every element may also err by this share of the layer's mean sum|x*w|: algorithms that
# transform the input (FFT and Winograd, which cuDNN picks on the course's layers, and our
# winograd rung) spread rounding across neighbouring outputs, so an output whose own terms are
# zero (a black patch of a Fashion-MNIST image) comes out as a tiny nonzero value, about 2% of
# a typical element's bound in the measured cuDNN case; a wrong term is 7x the bound or more.
FLOOR_SHARE = 1 / 16
TINY = float(np.finfo(np.float32).tiny)  # exact zeros, and products that underflow
# Epilogues computed with approximate functions: their absolute error, added to the bound.
# tanh: fused's fast tanh is within 5e-7 (kernels/fused.py); library tanhf within a few ulps.
EPILOGUE_ABSOLUTE = {"tanh-pool": 1e-6, "relu": 0.0}
# Outputs stored in a narrower type than they are computed in (an fp16 activation for the fp16
# conv after it): the unit roundoff of that one last rounding.
STORAGE_UNIT = {FLOAT16: 2.0 ** -11, BFLOAT16: 2.0 ** -8}
# Below the narrower type's normal range its spacing is fixed, so that rounding errs by up to
# half the smallest subnormal, whatever the value: fp16's is 2^-24, bf16's (float32's
# exponents, 7 stored significand bits) 2^-133.
STORAGE_FLOOR = {FLOAT16: 2.0 ** -25, BFLOAT16: 2.0 ** -134}


def unit_roundoff(precision: str) -> float:
    try:
        return UNIT_ROUNDOFF[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(UNIT_ROUNDOFF)}") from None


def poison(array) -> None:
    """Fill an output buffer with NaN (of its element type: bf16 bits too), so an element the
    kernel never writes cannot pass."""
    array.fill(poison_value(array.dtype))


@dataclass
class Reference:
    """The float64 result and what bounds a correct result's distance from it."""

    values: np.ndarray
    magnitude: np.ndarray  # sum |x*w| (+ |bias|) of each element's terms, through the epilogue
    length: int  # n: terms summed into one element
    absolute: float = 0.0  # extra allowance for approximate epilogue functions
    # The layer's mean sum|x*w|, where these elements are not a fair sample of the layer (every
    # image's first and last rows are mostly black borders on Fashion-MNIST); None: their own.
    layer_mean: float | None = None
    # One more rounding, of the computed value, to this unit roundoff (0: stored as computed),
    # and the absolute error it may have below the stored type's normal range.
    stored_unit: float = 0.0
    stored_floor: float = 0.0

    def mean_magnitude(self) -> float:
        if self.layer_mean is not None:
            return self.layer_mean
        return float(self.magnitude.mean()) if self.magnitude.size else 0.0

    def bound(self, precision: str) -> np.ndarray:
        u = unit_roundoff(precision)
        floor = FLOOR_SHARE * self.mean_magnitude()
        computed = (LAMBDA * math.sqrt(self.length) * u) * (self.magnitude + floor) \
            + (self.absolute + self.length * TINY)
        # The computed value is within `computed` of the reference, so its rounding errs by
        # at most stored_unit * (|ref| + computed).
        return computed + self.stored_unit * (np.abs(self.values) + computed) + self.stored_floor

    def rule(self, precision: str) -> str:
        u = unit_roundoff(precision)
        extra = f" + {self.absolute:g}" if self.absolute else ""
        if self.stored_unit:
            extra += f", then stored to u=2^{round(math.log2(self.stored_unit))}"
        if self.stored_floor:
            extra += f" (+ 2^{round(math.log2(self.stored_floor))} below its normal range)"
        return (f"|err| <= {LAMBDA:g}*sqrt(n)*u*(sum|x*w| + mean/16){extra} with n={self.length}, "
                f"u=2^{round(math.log2(u))} ({precision})")


@dataclass
class Check:
    passed: bool
    max_rel_error: float  # max |got - ref| / max |ref|; inf if any output is unwritten
    bound_ratio: float  # max over elements of |got - ref| / its bound (<= 1 passes)
    reason: str = ""
    unwritten: int = 0
    exceeded: int = 0  # elements over their bound
    rule: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _index(shape, flat: int) -> str:
    return "y[" + ",".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def compare(got: np.ndarray, ref: Reference, precision: str) -> Check:
    """Every element within its bound; NaN/inf never passes. A FAIL names the worst element, its
    bound, and how many elements exceed theirs. An output stored narrower than computed (fp16)
    is allowed that last rounding."""
    unit = STORAGE_UNIT.get(np.dtype(got.dtype), 0.0)
    if unit > ref.stored_unit:
        ref = replace(ref, stored_unit=unit,
                      stored_floor=max(ref.stored_floor, STORAGE_FLOOR[np.dtype(got.dtype)]))
    rule = ref.rule(precision)
    expected = ref.values
    if got.shape != expected.shape:
        return Check(False, math.inf, math.inf, f"output shape {got.shape}, expected {expected.shape}",
                     rule=rule)
    got64 = np.asarray(values(got), dtype=np.float64)
    bad = ~np.isfinite(got64)
    unwritten = int(bad.sum())
    if unwritten:
        first = int(np.flatnonzero(bad)[0])
        return Check(False, math.inf, math.inf,
                     f"{unwritten} of {got.size} outputs not written or not finite (first at "
                     f"{_index(got.shape, first)}, expected {expected.flat[first]:.6g}, got "
                     f"{got64.flat[first]})", unwritten, unwritten, rule)
    diff = np.abs(got64 - expected)
    bound = ref.bound(precision)
    ratio = diff / bound
    worst = int(ratio.argmax())
    scale = float(np.abs(expected).max()) or 1.0
    rel = float(diff.max()) / scale
    over = int((ratio > 1.0).sum())
    if over:
        return Check(False, rel, float(ratio.flat[worst]),
                     f"error {diff.flat[worst]:.3g} at {_index(got.shape, worst)} is "
                     f"{ratio.flat[worst]:.3g}x its bound {bound.flat[worst]:.3g} (expected "
                     f"{expected.flat[worst]:.6g}, got {got64.flat[worst]:.6g}); {over} of "
                     f"{got.size} outputs exceed their bounds ({rule})", 0, over, rule)
    return Check(True, rel, float(ratio.flat[worst]), rule=rule)


def reference_output(x: np.ndarray, w: np.ndarray, shape, epilogue: str | None,
                     bias: np.ndarray | None = None, kept: np.ndarray | None = None) -> Reference:
    """The float64 result a variant should produce, with the epilogue applied if it has one,
    and the magnitudes that bound its rounding error. "add-relu" adds `kept` (the residual
    block's kept activation, the output's shape) before the ReLU."""
    values, magnitude = conv2d_with_magnitude(x, w, bias=bias, **conv_shape_args(shape))
    if epilogue == "add-relu":
        if kept is None or np.shape(kept) != values.shape:
            raise ValueError(f"an add-relu reference adds a kept activation of shape "
                             f"{values.shape}, got {None if kept is None else np.shape(kept)}")
        values = relu(values + kept)
        magnitude = magnitude + np.abs(kept)
    elif epilogue == "relu":
        values = relu(values)
    elif epilogue == "tanh-pool":
        values = max_pool(np.tanh(values), 2)
        magnitude = max_pool(magnitude, 2)  # tanh and max are 1-Lipschitz
    elif epilogue is not None:
        raise ValueError(f"no reference for epilogue {epilogue!r}")
    return Reference(values, magnitude, shape.reduction, EPILOGUE_ABSOLUTE.get(epilogue, 0.0))


def random_problem(shape, rng: np.random.Generator, signed: bool = False):
    """Fresh (x, w, bias) for a layer: inputs in [0, 1) like image pixels ([-1, 1) if `signed`),
    zero-mean filters scaled like trained ones, and a bias when the layer has one (else None)."""
    x = rng.random(shape.input_shape, dtype=np.float32)
    if signed:
        x = 2 * x - 1
    fan_in = shape.Cg * shape.taps
    w = (rng.standard_normal(shape.weight_shape) / np.sqrt(fan_in)).astype(np.float32)
    b = (0.1 * rng.standard_normal(shape.M)).astype(np.float32) if shape.bias else None
    return x, w, b


def magnitude_for_units(extra_units: np.ndarray | float, n: int) -> np.ndarray | float:
    """Reference.bound is LAMBDA*sqrt(n)*u*magnitude. To add `extra_units`*u*|y| (a handful of
    roundings counted at their worst case) to the bound of a sum's n-term law, the magnitude
    grows by extra_units / (LAMBDA*sqrt(n)) times |y|."""
    return extra_units / (LAMBDA * math.sqrt(n))
