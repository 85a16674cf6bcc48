"""The verification rule on the CPU: correct arithmetic passes at every reduction length, and the
classic bugs fail at short and long ones. The GPU tests repeat this with real kernels."""

import numpy as np
import pytest

from convlab.gpu.elements import values
from convlab.oracle.reference import conv2d
from convlab.oracle.verify import (LAMBDA, Reference, compare, poison, random_problem,
                                   reference_output, unit_roundoff)
from convlab.shapes import ConvShape

# Reduction lengths C*K*K from the course's 25 to 512x3x3 = 4,608 and beyond.
LENGTHS = [ConvShape(2, 1, 12, 12, 8, 5), ConvShape(2, 3, 15, 15, 8, 7),
           ConvShape(2, 96, 9, 9, 8, 5), ConvShape(1, 512, 6, 6, 8, 3),
           ConvShape(1, 1024, 5, 5, 4, 3, pad=1, bias=True)]


def ids(shape):
    return f"n{shape.reduction}"


def rounded_tf32(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def sequential_fp32(x, w, shape, b=None):
    """A correct float32 kernel, emulated: each output summed term by term in float32, in
    (c, p, q) order, the way the naive kernel does it."""
    xp = np.pad(x, ((0, 0), (0, 0), (shape.pad,) * 2, (shape.pad,) * 2))
    acc = np.zeros(shape.output_shape, np.float32)
    s = shape.stride
    for c in range(shape.C):
        for p in range(shape.K):
            for q in range(shape.K):
                rows = xp[:, c, p:p + s * shape.Ho:s, q:q + s * shape.Wo:s]
                acc += rows[:, None] * w[None, :, c, p, q, None, None]
    return acc + b[None, :, None, None] if b is not None else acc


def test_exact_output_passes(rng):
    shape = ConvShape(2, 3, 8, 8, 4, 3)
    x, w, _ = random_problem(shape, rng)
    ref = reference_output(x, w, shape, None)
    check = compare(ref.values.astype(np.float32), ref, "fp32")
    assert check.passed and check.bound_ratio < 0.05 and check.max_rel_error < 1e-7
    assert "n=27" in check.rule and "2^-24" in check.rule


@pytest.mark.parametrize("signed", [False, True], ids=["x01", "signed"])
@pytest.mark.parametrize("shape", LENGTHS, ids=ids)
def test_correct_fp32_arithmetic_passes_at_every_length(shape, signed, rng):
    x, w, b = random_problem(shape, rng, signed=signed)
    ref = reference_output(x, w, shape, None, b)
    blas = conv2d(x, w, shape.stride, shape.pad, shape.groups, b)  # any BLAS order
    assert compare(blas, ref, "fp32").passed
    check = compare(sequential_fp32(x, w, shape, b), ref, "fp32")
    assert check.passed, check.reason
    assert check.bound_ratio < 0.5  # the margin the choice of LAMBDA leaves


@pytest.mark.parametrize("shape", LENGTHS, ids=ids)
def test_tf32_rounded_inputs_pass_tf32_and_fail_fp32_on_short_reductions(shape, rng):
    """TF32 input rounding errs by about 2^-11 * sqrt(n) * rms|x*w|, the fp32 bound allows
    8 * sqrt(n) * 2^-24 * sum|x*w|: the fp32 rule tells TF32 from FP32 while n < ~1,000 only
    (a documented limit of the sqrt(n) * sum|x*w| form, verify.py)."""
    x, w, b = random_problem(shape, rng, signed=True)
    ref = reference_output(x, w, shape, None, b)
    got = conv2d(rounded_tf32(x), rounded_tf32(w), shape.stride, shape.pad, shape.groups, b)
    assert compare(got, ref, "tf32").passed
    if shape.reduction < 500:
        assert not compare(got, ref, "fp32").passed


def _broken(kind, x, w, shape, b):
    """What four classic kernel bugs compute, emulated in float32."""
    if kind == "tap skipped":  # one filter tap (the last) never read
        w = w.copy()
        w[:, :, -1, -1] = 0
        return conv2d(x, w, shape.stride, shape.pad, shape.groups, b)
    if kind == "input row off by one":  # filter row K-1 reads input row h+K instead of h+K-1
        head, last = w.copy(), np.zeros_like(w)
        head[:, :, -1], last[:, :, -1] = 0, w[:, :, -1]
        shifted = np.concatenate([x[:, :, 1:], x[:, :, -1:]], axis=2)
        return (conv2d(x, head, shape.stride, shape.pad, shape.groups, b)
                + conv2d(shifted, last, shape.stride, shape.pad, shape.groups))
    if kind == "one wrong weight index":  # tap (c=0, p=0, q=0) takes w[m][0][0][1]
        wrong = w.copy()
        wrong[:, 0, 0, 0] = w[:, 0, 0, 1]
        return conv2d(x, wrong, shape.stride, shape.pad, shape.groups, b)
    if kind == "last row unwritten":
        y = conv2d(x, w, shape.stride, shape.pad, shape.groups, b)
        poison(y[:, :, -1])
        return y
    if kind == "last channel unwritten":
        y = conv2d(x, w, shape.stride, shape.pad, shape.groups, b)
        poison(y[:, -1])
        return y
    raise ValueError(kind)


BUGS = ["tap skipped", "input row off by one", "one wrong weight index", "last row unwritten",
        "last channel unwritten"]


@pytest.mark.parametrize("kind", BUGS)
@pytest.mark.parametrize("shape", [LENGTHS[0], LENGTHS[3]], ids=ids)
def test_classic_bugs_fail_on_short_and_long_reductions(kind, shape, rng):
    x, w, b = random_problem(shape, rng, signed=True)
    check = compare(_broken(kind, x, w, shape, b), reference_output(x, w, shape, None, b), "fp32")
    assert not check.passed
    assert check.exceeded > 0 and check.reason


def test_unwritten_outputs_are_named(rng):
    ref = Reference(rng.standard_normal((2, 3, 4, 5)), np.ones((2, 3, 4, 5)), 9)
    got = ref.values.astype(np.float32)
    poison(got[1, 2])  # a whole output map never written
    check = compare(got, ref, "fp32")
    assert not check.passed and check.unwritten == 20
    assert "20 of 120 outputs not written" in check.reason and "y[1,2,0,0]" in check.reason


def test_fail_names_worst_element_its_bound_and_the_count(rng):
    values = rng.standard_normal((1, 2, 3, 3))
    ref = Reference(values, np.abs(values) + 1.0, 25)
    got = values.astype(np.float32)
    got[0, 1, 2, 0] += 1.0
    got[0, 0, 0, 0] += 1e-3
    check = compare(got, ref, "fp32")
    floor = (np.abs(values) + 1.0).mean() / 16
    bound = LAMBDA * 5 * unit_roundoff("fp32") * (abs(values[0, 1, 2, 0]) + 1.0 + floor)
    assert not check.passed and check.exceeded == 2
    assert "at y[0,1,2,0]" in check.reason and f"expected {values[0, 1, 2, 0]:.6g}" in check.reason
    assert f"bound {bound:.3g}" in check.reason
    assert "2 of 18 outputs exceed their bounds" in check.reason


def test_bound_follows_each_elements_magnitude():
    """A small element is held to its own small bound (plus a sixteenth of the layer's mean),
    not to the tensor's largest value as one relative tolerance would hold it."""
    values = np.array([1000.0, 1e-3, 1e-3, 1e-3])
    ref = Reference(values, np.abs(values), 25)
    small, large = values.copy(), values.copy()
    small[1] += 2e-4  # large next to 1e-3 and the mean's share
    large[0] += 2e-4  # tiny next to 1000
    assert not compare(small, ref, "fp32").passed
    assert compare(large, ref, "fp32").passed
    assert compare(small, ref, "bf16").passed


def test_zero_windows_get_a_floor_from_the_layer_not_from_themselves():
    """An output whose own terms are all zero may err by a sixteenth of the layer's mean bound
    (transform algorithms such as cuDNN's FFT leave ~1e-7 there), no more."""
    magnitude = np.array([0.0, 3.0, 3.0, 3.0])
    ref = Reference(np.zeros(4), magnitude, 49)
    typical = LAMBDA * 7 * unit_roundoff("fp32") * 3.0
    got = np.zeros(4)
    got[0] = 0.02 * typical  # the measured cuDNN case: 2% of a typical element's bound
    assert compare(got, ref, "fp32").passed
    got[0] = 0.5 * typical  # half a typical bound at a zero window is not rounding
    assert not compare(got, ref, "fp32").passed


def test_exact_zeros_must_be_exact():
    ref = Reference(np.zeros(4), np.zeros(4), 9)
    assert compare(np.zeros(4, np.float32), ref, "fp32").passed
    assert not compare(np.array([0, 0, 1e-20, 0], np.float32), ref, "fp32").passed


def test_shape_mismatch_fails():
    ref = Reference(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)), 1)
    assert not compare(np.zeros((1, 2, 3, 3), np.float32), ref, "fp32").passed


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="unknown precision"):
        unit_roundoff("fp8")


def test_reference_output_epilogues(rng):
    shape = ConvShape(2, 3, 9, 8, 4, 3, bias=True)
    x, w, b = random_problem(shape, rng, signed=True)
    plain = reference_output(x, w, shape, None, b)
    pooled = reference_output(x, w, shape, "tanh-pool", b)
    relu = reference_output(x, w, shape, "relu", b)
    assert plain.values.shape == (2, 4, 7, 6) and pooled.values.shape == (2, 4, 3, 3)
    np.testing.assert_allclose(pooled.values[1, 2, 0, 0], np.tanh(plain.values[1, 2, :2, :2].max()))
    assert pooled.magnitude[1, 2, 0, 0] == plain.magnitude[1, 2, :2, :2].max()
    assert pooled.absolute > 0 and plain.absolute == 0
    np.testing.assert_array_equal(relu.values, np.maximum(plain.values, 0))
    assert plain.length == 3 * 9 + 1
    # the magnitude is sum |x*w| + |b| over each element's terms
    expected = conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64),
                      bias=np.abs(b).astype(np.float64), dtype=np.float64)
    np.testing.assert_allclose(plain.magnitude, expected, rtol=1e-12)


def test_grouped_reference_uses_only_its_groups_channels(rng):
    shape = ConvShape(1, 4, 5, 5, 6, 3, groups=2)
    x, w, _ = random_problem(shape, rng)
    ref = reference_output(x, w, shape, None).values
    x2 = x.copy()
    x2[:, 2:] = 0  # the second group's inputs: only channels 3..5 may change
    ref2 = reference_output(x2, w, shape, None).values
    np.testing.assert_array_equal(ref[:, :3], ref2[:, :3])
    assert not np.allclose(ref[:, 3:], ref2[:, 3:])


def test_random_problem_is_never_zero(rng):
    x, w, b = random_problem(ConvShape(3, 2, 6, 6, 4, 3, bias=True), rng)
    assert x.dtype == np.float32 and w.dtype == np.float32 and b.shape == (4,)
    assert np.count_nonzero(x) > 0.99 * x.size and np.abs(w).min() > 0
    xs, _, none = random_problem(ConvShape(3, 2, 6, 6, 4, 3), rng, signed=True)
    assert none is None and xs.min() < 0 < xs.max()


def test_an_fp16_output_is_allowed_its_last_rounding_and_no_more():
    """An output stored as fp16 (an activation for the fp16 conv after it) may differ from
    float64 by that rounding: within u = 2^-11 of |ref| on top of the computation's bound."""
    values = np.array([1.0 + 3 * 2.0 ** -12, 1000.3, -0.1])
    ref = Reference(values, np.zeros(3), 1)  # a max-pool's: exact in any precision
    stored = values.astype(np.float16)
    assert compare(stored, ref, "fp32").passed
    assert "stored to u=2^-11" in compare(stored, ref, "fp32").rule
    assert not compare(stored.astype(np.float32), ref, "fp32").passed
    two_ulps = stored.copy()
    two_ulps[1] = np.float16(1001.0)  # fp16 ulps are 0.5 at 1000
    assert not compare(two_ulps, ref, "fp32").passed


def test_a_bf16_output_is_read_as_its_values_and_allowed_its_last_rounding():
    """An output stored as bf16 bits (an activation for the bf16 conv after it) is compared as
    the values those bits hold, within bf16's u = 2^-8 of |ref|; as plain integers, or two
    bf16 steps off, it fails."""
    from convlab.kernels.igemm.packing import to_bf16_bits

    exact = np.array([1.0 + 3 * 2.0 ** -10, 1000.3, -0.1], dtype=np.float32)
    ref = Reference(exact.astype(np.float64), np.zeros(3), 1)
    stored = to_bf16_bits(exact)
    assert stored.dtype == np.uint16
    check = compare(stored, ref, "fp32")
    assert check.passed, check.reason
    assert "stored to u=2^-8" in check.rule
    assert not compare(stored.astype(np.float32), ref, "fp32").passed
    two_steps = stored.copy()
    two_steps[1] += 2  # bf16 steps are 4 at 1000: 1008 against 1000.3
    assert not compare(two_steps, ref, "fp32").passed


def test_a_poisoned_bf16_buffer_holds_nan_bits():
    """poison fills bf16 bits with a bf16 NaN (a NaN cast to an integer type is no NaN), so a
    bf16 element the kernel never writes cannot pass."""
    y = np.zeros(4, dtype=np.uint16)
    poison(y)
    assert np.isnan(values(y)).all()
    check = compare(y, Reference(np.zeros(4), np.zeros(4), 1), "bf16")
    assert not check.passed and check.unwritten == 4
