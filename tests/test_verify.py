import numpy as np
import pytest

from convlab.shapes import ConvShape
from convlab.verify import compare, poison, random_problem, reference_output, tolerance


def test_tolerances_follow_design():
    assert tolerance("fp32") == 1e-5 and tolerance("tf32") == 2e-3 and tolerance("fp16") == 1e-2


def test_exact_output_passes(rng):
    ref = rng.standard_normal((2, 3, 4, 5))
    check = compare(ref.astype(np.float32), ref, "fp32")
    assert check.passed and check.max_rel_error < 1e-7


def test_unwritten_outputs_are_named(rng):
    ref = rng.standard_normal((2, 3, 4, 5))
    got = ref.astype(np.float32)
    poison(got[1, 2])  # a whole output map never written
    check = compare(got, ref, "fp32")
    assert not check.passed and check.unwritten == 20
    assert "20 of 120 outputs not written" in check.reason and "y[1,2,0,0]" in check.reason


def test_wrong_value_reports_position_expected_and_got(rng):
    ref = rng.standard_normal((1, 2, 3, 3))
    got = ref.astype(np.float32)
    got[0, 1, 2, 0] += 1.0
    check = compare(got, ref, "fp32")
    assert not check.passed
    assert "at y[0,1,2,0]" in check.reason and f"expected {ref[0, 1, 2, 0]:.6g}" in check.reason
    assert "1 of 18 outputs" in check.reason


def test_tf32_sized_error_passes_tf32_but_not_fp32(rng):
    ref = rng.standard_normal((1, 4, 8, 8)) + 3.0
    got = (ref * (1 + 3e-4)).astype(np.float32)
    assert compare(got, ref, "tf32").passed
    assert not compare(got, ref, "fp32").passed


def test_shape_mismatch_fails(rng):
    assert not compare(np.zeros((1, 2, 3, 3), np.float32), np.zeros((1, 2, 3, 4)), "fp32").passed


def test_reference_output_with_epilogue(rng):
    shape = ConvShape(2, 3, 9, 8, 4, 3)
    x, w = random_problem(shape, rng)
    plain = reference_output(x, w, shape, None)
    pooled = reference_output(x, w, shape, "tanh-pool")
    assert plain.shape == (2, 4, 7, 6) and pooled.shape == (2, 4, 3, 3)
    np.testing.assert_allclose(pooled[1, 2, 0, 0], np.tanh(plain[1, 2, :2, :2].max()))


def test_random_problem_is_never_zero(rng):
    x, w = random_problem(ConvShape(3, 2, 6, 6, 4, 3), rng)
    assert x.dtype == np.float32 and w.dtype == np.float32
    assert np.count_nonzero(x) > 0.99 * x.size and np.abs(w).min() > 0
