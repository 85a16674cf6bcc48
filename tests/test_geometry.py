"""Rectangular filters, padding that differs along H and W, and dilation: the shape, the
float64 reference (against the convolution's definition), the verifier's edge rows, the
variants that take them and those that refuse, and the host tables and copy-engine corners
the channels-last and wgmma kernels read."""

import numpy as np
import pytest

from convlab.bench import guard
from convlab.errors import ConvlabError
from convlab.gpu import tensormap
from convlab.kernels import VARIANTS
from convlab.kernels.igemm import cost, gather_nhwc, halo, tiling, wgmma
from convlab.kernels.igemm.tiling import Tiling
from convlab.oracle.reference import conv2d_float64, conv2d_with_magnitude, conv_shape_args
from convlab.oracle.verify import random_problem, reference_output
from convlab.shapes import ConvShape

INCEPTION_1X7 = ConvShape(2, 6, 9, 9, 4, 1, pad=0, Kw=7, pad_w=3, bias=True)
DILATED = ConvShape(2, 3, 11, 10, 5, 3, stride=2, pad=2, dilation=2, bias=True)
BOTH = ConvShape(1, 4, 12, 13, 6, 2, pad=1, Kw=3, pad_w=0, dilation=3, groups=2)


def definition(x, w, shape, bias=None):
    """The loop nest: y[b,m,h,v] = bias[m] + sum x[b, g*Cg+c, h*s+p*d-ph, v*s+q*d-pw] w[m,c,p,q]."""
    y = np.zeros(shape.output_shape)
    for b in range(shape.B):
        for m in range(shape.M):
            g = m // shape.Mg
            for h in range(shape.Ho):
                for v in range(shape.Wo):
                    total = 0.0 if bias is None else float(bias[m])
                    for c in range(shape.Cg):
                        for p in range(shape.Kh):
                            for q in range(shape.Kw):
                                i = h * shape.stride + p * shape.dilation - shape.pad_h
                                j = v * shape.stride + q * shape.dilation - shape.pad_w
                                if 0 <= i < shape.H and 0 <= j < shape.W:
                                    total += (float(x[b, g * shape.Cg + c, i, j])
                                              * float(w[m, c, p, q]))
                    y[b, m, h, v] = total
    return y


@pytest.mark.parametrize("shape", [INCEPTION_1X7, DILATED, BOTH],
                         ids=["1x7", "dilated", "rect-dilated-groups"])
def test_reference_is_the_definition(shape, rng):
    x, w, b = random_problem(shape, rng, signed=True)
    expected = definition(x, w, shape, b)
    np.testing.assert_allclose(conv2d_float64(x, w, bias=b, **conv_shape_args(shape)), expected,
                               rtol=1e-12, atol=1e-12)
    _, magnitude = conv2d_with_magnitude(x, w, bias=b, **conv_shape_args(shape))
    np.testing.assert_allclose(magnitude, definition(np.abs(x), np.abs(w), shape,
                                                     None if b is None else np.abs(b)),
                               rtol=1e-12)


def test_shape_sizes_and_words():
    assert (INCEPTION_1X7.Ho, INCEPTION_1X7.Wo) == (9, 9)
    assert (DILATED.Ho, DILATED.Wo) == (6, 5)
    assert INCEPTION_1X7.weight_shape == (4, 6, 1, 7) and INCEPTION_1X7.reduction == 6 * 7 + 1
    assert INCEPTION_1X7.features() == {"pad", "bias", "rectangular"}
    assert DILATED.features() == {"stride", "pad", "bias", "dilation"}
    assert INCEPTION_1X7.brief() == "6x9x9->4x9x9 1x7 p0x3 +b"
    assert DILATED.brief() == "3x11x10->5x6x5 3x3 s2 p2 d2 +b"
    assert ConvShape(1, 2, 9, 9, 2, 3, pad=1, Kw=3, pad_w=1) == ConvShape(1, 2, 9, 9, 2, 3, pad=1)
    assert ConvShape(1, 2, 9, 9, 2, 3).as_dict() == {"B": 1, "C": 2, "H": 9, "W": 9, "M": 2,
                                                     "K": 3, "stride": 1, "pad": 0, "groups": 1,
                                                     "bias": False}
    assert ConvShape(**BOTH.as_dict()) == BOTH


def test_a_dilated_filter_that_does_not_fit_says_so():
    with pytest.raises(ConvlabError, match="3x3 dilated 4x kernel does not fit a 7x7 input"):
        ConvShape(1, 1, 7, 7, 1, 3, dilation=4)
    with pytest.raises(ConvlabError, match="dilation must be a positive integer"):
        ConvShape(1, 1, 7, 7, 1, 3, dilation=0)


def test_only_the_nhwc_families_cudnn_and_the_cpu_take_them():
    takes = {"cpu", "channels-last", "channels-last-3xtf32", "channels-last-fp16",
             "channels-last-bf16", "wgmma", "wgmma-3xtf32", "wgmma-split-bf16", "wgmma-fp16",
             "wgmma-bf16"} | {n for n in VARIANTS if n.startswith("cudnn")}
    for name, variant in VARIANTS.items():
        expected = name in takes
        assert ("rectangular" in variant.general) == expected, name
        assert ("dilation" in variant.general) == expected, name
    reason = VARIANTS["pipelined"].supports(INCEPTION_1X7).reason
    assert "implements no 1x7 filter with padding 0x3 (rectangular)" in reason
    assert "implements no dilation 2" in VARIANTS["naive"].supports(DILATED).reason
    assert "undilated 3x3" in VARIANTS["winograd"].supports(ConvShape(1, 2, 9, 9, 2, 3, pad=2,
                                                                      dilation=2)).reason


def test_the_halo_schedule_is_not_offered_a_rectangular_or_dilated_layer():
    square = ConvShape(8, 64, 14, 14, 64, 3, pad=1)
    assert any(t.schedule == "halo" for t in cost.ranked(square, "fp16", wgmma.FAMILY))
    for shape in (ConvShape(8, 64, 14, 14, 64, 1, Kw=3, pad_w=1),
                  ConvShape(8, 64, 14, 14, 64, 3, pad=2, dilation=2)):
        assert not any(t.schedule == "halo" for t in cost.ranked(shape, "fp16", wgmma.FAMILY))
        t = Tiling(64, 112, 64, 4, 1, 2, 1, "tap", "halo", 1)
        assert "square, undilated filters" in halo.problem(shape, t, "fp16", 9)


def test_nhwc_table_offsets_step_by_the_dilation():
    shape = ConvShape(1, 4, 20, 20, 8, 3, pad=2, Kw=2, pad_w=1, dilation=2)
    t = Tiling(64, 32, 32, 4, 1, 3, 1, "table")
    table = gather_nhwc.gather_table(shape, t, 4)
    for k in range(shape.taps):  # one 4-channel vector a tap
        p, q = divmod(k, shape.Kw)
        assert list(table[k]) == [(2 * p * shape.W + 2 * q) * shape.C, 2 * p, 2 * q, 1]
    assert table[shape.taps, 1] == tiling.INVALID_TAP


def test_copy_engine_corners_follow_each_axis():
    lower, upper = tensormap.corners(ConvShape(1, 64, 17, 17, 64, 1, pad=0, Kw=7, pad_w=3))
    assert lower == (-3, 0) and upper == (-3, 0)  # (along W, along H)
    lower, upper = tensormap.corners(ConvShape(1, 64, 17, 17, 64, 3, pad=2, Kw=5, pad_w=4,
                                               dilation=2))
    assert lower == (-4, -2) and upper == (4 - 8, 2 - 4)
    wide = ConvShape(1, 64, 300, 300, 64, 3, pad=1, dilation=70)
    assert "outside the copy engine's [-128, 127]" in tensormap.im2col_problem(wide, 64, 2)


@pytest.mark.parametrize("shape", [INCEPTION_1X7, DILATED, BOTH],
                         ids=["1x7", "dilated", "rect-dilated-groups"])
def test_the_verifiers_edge_rows_match_the_whole_reference(shape, rng):
    shape = shape.with_batch(5)
    x, w, b = random_problem(shape, rng)
    ref = reference_output(x, w, shape, "relu", b)
    layer = guard.Layer(shape, w, b, "relu", "fp32")
    assert guard.check_edge_rows(layer, x, ref.values.astype(np.float32), rng).passed
    wrong = ref.values.astype(np.float32)
    wrong[:, :, -1, -1] += 1.0
    assert not guard.check_edge_rows(layer, x, wrong, rng).passed
