"""Each diagnosis on a deliberately broken output, made with NumPy on the CPU.

The broken outputs are what a kernel with that bug would produce: a float32 result of the
changed computation (or the reference rearranged), so they differ from the reference by far
more than the error bound wherever the bug matters."""

import numpy as np
import pytest

from convlab.oracle.diagnose import diagnose, edge_band, ranges, tile_period
from convlab.oracle.reference import conv2d_with_magnitude
from convlab.oracle.verify import random_problem, reference_output
from convlab.shapes import ConvShape

SHAPE = ConvShape(3, 4, 14, 14, 6, 3)


def problem(rng, shape=SHAPE, signed=True):
    x, w, b = random_problem(shape, rng, signed=signed)
    return x, w, b, reference_output(x, w, shape, None, b)


def conv32(x, w, shape, bias=None):
    values, _ = conv2d_with_magnitude(x, w, shape.stride, shape.pad, shape.groups, bias)
    return values.astype(np.float32)


def test_ranges_and_bands():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert ranges([]) == "none"
    assert "ranges" in ranges(list(range(0, 40, 2)), limit=3)
    assert edge_band(np.array([10, 11]), 12) == (0, 2)
    assert edge_band(np.array([0, 11]), 12) == (1, 1)
    assert edge_band(np.array([3, 4]), 12) is None
    assert tile_period(np.array([7, 15, 23]), 30) == (8, [7])
    assert tile_period(np.array([6, 7, 14, 15, 22, 23]), 30) == (8, [6, 7])
    assert tile_period(np.array([3, 9, 10]), 30) is None


def test_correct_output_passes(rng):
    x, w, _, ref = problem(rng)
    d = diagnose(conv32(x, w, SHAPE), ref, x, w, SHAPE, "fp32")
    assert d.passed and d.wrong == 0 and d.explanation is None


def test_unwritten_last_column(rng):
    x, w, _, ref = problem(rng)
    got = conv32(x, w, SHAPE)
    got[..., -1] = np.nan
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert d.unwritten == SHAPE.B * SHAPE.M * SHAPE.Ho and d.wrong == 0
    assert "never written" in d.text() and "columns 11 (of 12)" in d.text()
    assert "the last 1 columns" in d.text()


def test_border_of_width_k_minus_1(rng):
    shape = ConvShape(2, 3, 20, 20, 4, 5)
    x, w, _, ref = problem(rng, shape)
    got = conv32(x, w, shape)
    got[:, :, -4:, :] += 1.0
    d = diagnose(got, ref, x, w, shape, "fp32")
    assert "the last 4 rows" in d.text() and "border of width K-1 = 4" in d.text()
    assert "rows 12-15 (of 16)" in d.region["rows"]
    assert "gross" in d.text()


def test_tile_edge(rng):
    shape = ConvShape(2, 2, 42, 42, 3, 3)
    x, w, _, ref = problem(rng, shape)
    got = conv32(x, w, shape)
    rows = [r for r in range(shape.Ho) if r % 16 in (14, 15)]
    got[:, :, rows, :] *= -1.0
    d = diagnose(got, ref, x, w, shape, "fp32")
    assert "every 16-row tile" in d.text() and "14-15, 30-31" in d.text()


def test_first_images_only_with_zeros_elsewhere(rng):
    shape = ConvShape(40, 1, 9, 9, 3, 3)
    x, w, _, ref = problem(rng, shape, signed=False)
    got = conv32(x, w, shape)
    got[32:] = 0.0
    d = diagnose(got, ref, x, w, shape, "fp32")
    assert "images 32-39 (of 40)" in d.text()
    assert "whole images are wrong (32-39)" in d.text() and "exactly 0" in d.text()


def test_zeroed_images_are_whole_even_where_a_zero_happens_to_pass(rng):
    shape = ConvShape(40, 1, 9, 9, 3, 3)
    x, w, _, ref = problem(rng, shape, signed=False)
    got = conv32(x, w, shape)
    got[32:] = 0.0
    # Where the reference is within its bound of zero, the zeroed output passes: three of one
    # image's 147 (2%) and one of another's.
    got[35, 0, 2, 2:5] = ref.values[35, 0, 2, 2:5]
    got[37, 1, 4, 4] = ref.values[37, 1, 4, 4]
    d = diagnose(got, ref, x, w, shape, "fp32")
    assert d.wrong < 8 * 3 * 7 * 7
    assert "whole images are wrong (32-39)" in d.text()


def test_image_labels_name_the_batch_indices(rng):
    shape = ConvShape(3, 1, 9, 9, 2, 3)
    x, w, _, ref = problem(rng, shape)
    got = conv32(x, w, shape)
    got[1] += 5.0
    d = diagnose(got, ref, x, w, shape, "fp32", images=[4, 17, 99])
    assert "images 17 (of 3)" in d.text() and "y[17," in d.text()


def test_shifted_by_one_row(rng):
    x, w, _, ref = problem(rng)
    # The kernel reads input row h+p+1 (clamped inside the image): output row h is row h+1's.
    shifted = np.concatenate([x[:, :, 1:], x[:, :, -1:]], axis=2)
    got = conv32(shifted, w, SHAPE)
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert d.explanation is not None and "shifted by one row" in d.explanation
    assert "row h+1" in d.explanation


def test_shifted_by_one_column(rng):
    x, w, _, ref = problem(rng)
    got = np.zeros_like(ref.values, dtype=np.float32)
    got[..., 1:] = ref.values[..., :-1]
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert "shifted by one column" in d.explanation and "column w-1" in d.explanation


def test_transposed_output(rng):
    x, w, _, ref = problem(rng)
    got = conv32(x, w, SHAPE).swapaxes(-1, -2).copy()
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert "transposed" in d.explanation and "output" in d.explanation


def test_flipped_filter(rng):
    x, w, _, ref = problem(rng)
    got = conv32(x, w[..., ::-1, ::-1].copy(), SHAPE)
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert "flipped" in d.explanation and "cross-correlation" in d.explanation


def test_transposed_filter(rng):
    x, w, _, ref = problem(rng)
    got = conv32(x, w.swapaxes(-1, -2).copy(), SHAPE)
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert "filter transposed" in d.explanation


def test_permuted_output_channels(rng):
    x, w, _, ref = problem(rng)
    perm = [1, 0, 2, 3, 5, 4]
    got = conv32(x, w, SHAPE)[:, perm]
    d = diagnose(got, ref, x, w, SHAPE, "fp32")
    assert "permuted" in d.explanation and "0<-1" in d.explanation and "4 of 6" in d.explanation
    reversed_ = diagnose(conv32(x, w, SHAPE)[:, ::-1].copy(), ref, x, w, SHAPE, "fp32")
    assert "reverse order" in reversed_.explanation


def test_skipped_input_channel(rng):
    x, w, _, ref = problem(rng)
    broken = w.copy()
    broken[:, SHAPE.C - 1] = 0
    d = diagnose(conv32(x, broken, SHAPE), ref, x, w, SHAPE, "fp32")
    assert "input channel 3" in d.explanation and "the last" in d.explanation


def test_skipped_last_filter_column(rng):
    x, w, _, ref = problem(rng)
    broken = w.copy()
    broken[..., SHAPE.K - 1] = 0
    d = diagnose(conv32(x, broken, SHAPE), ref, x, w, SHAPE, "fp32")
    assert "filter column q=2 (the last)" in d.explanation and "K-1" in d.explanation


def test_grouped_layer_skipped_channel(rng):
    shape = ConvShape(2, 4, 9, 9, 6, 3, pad=1, groups=2)
    x, w, _, ref = problem(rng, shape)
    broken = w.copy()
    broken[:, 0] = 0
    d = diagnose(conv32(x, broken, shape), ref, x, w, shape, "fp32")
    assert "input channel 0" in d.explanation


def test_missing_bias_and_missing_relu(rng):
    shape = ConvShape(2, 3, 9, 9, 4, 3, bias=True)
    x, w, b = random_problem(shape, rng, signed=True)
    big = b + np.float32(1.0)  # large enough that leaving it out is gross
    ref = reference_output(x, w, shape, None, big)
    d = diagnose(conv32(x, w, shape), ref, x, w, shape, "fp32", bias=big)
    assert "without the bias" in d.explanation
    # With the signed bias about half the outputs are negative; the +1 one could leave too few
    # for the ReLU to tell (2 of 392, with numpy seed 364487548).
    relu_ref = reference_output(x, w, shape, "relu", b)
    d = diagnose(conv32(x, w, shape, b), relu_ref, x, w, shape, "fp32", bias=b, epilogue="relu")
    assert "without the ReLU" in d.explanation


def test_half_precision_products_look_like_rounding(rng):
    shape = ConvShape(2, 4, 10, 10, 5, 5)  # n = 100 terms
    x, w, _, ref = problem(rng, shape)
    got = conv32(x.astype(np.float16).astype(np.float32),
                 w.astype(np.float16).astype(np.float32), shape)
    d = diagnose(got, ref, x, w, shape, "fp32")
    assert d.wrong > 0 and d.explanation is None
    assert "rounding-sized" in d.text() and "tf32/fp16" in d.text()
    assert not diagnose(got, ref, x, w, shape, "fp16").wrong


def test_shape_mismatch_is_reported(rng):
    x, w, _, ref = problem(rng)
    d = diagnose(np.zeros((1, 2, 3, 4), np.float32), ref, x, w, SHAPE, "fp32")
    assert "shape" in d.text() and not d.passed


@pytest.mark.parametrize("epilogue", [None, "tanh-pool"])
def test_epilogues_keep_the_diagnosis(rng, epilogue):
    shape = ConvShape(2, 3, 12, 12, 4, 3)
    x, w, _ = random_problem(shape, rng, signed=True)
    ref = reference_output(x, w, shape, epilogue)
    got_conv, _ = conv2d_with_magnitude(x, w[..., ::-1, ::-1].copy())
    from convlab.oracle.diagnose import _through_epilogue

    got = _through_epilogue(got_conv, epilogue).astype(np.float32)
    d = diagnose(got, ref, x, w, shape, "fp32", epilogue=epilogue)
    assert "flipped" in d.explanation
