"""GPU checks for rectangular and dilated filters: the channels-last and wgmma variants against
float64 at their precision's bound, in every schedule and gather that takes such a layer (the
grid schedule's tap and table gathers, the persistent schedule's cp.async and copy-engine
gathers), on Inception's 1x7 and 7x1 layers and dilated 3x3s, odd sizes and batches."""

import numpy as np
import pytest

from convlab.kernels import RELU, get_variant
from convlab.oracle.verify import compare, random_problem, reference_output
from convlab.shapes import ConvShape

pytestmark = pytest.mark.gpu

VARIANTS = [get_variant(n) for n in ("channels-last", "channels-last-3xtf32",
                                     "channels-last-fp16", "channels-last-bf16", "wgmma",
                                     "wgmma-3xtf32", "wgmma-fp16", "wgmma-bf16")]
IDS = [v.name for v in VARIANTS]

SHAPES = [
    ConvShape(3, 128, 17, 17, 128, 1, pad=0, Kw=7, pad_w=3, bias=True),  # Inception's 1x7
    ConvShape(2, 128, 17, 17, 192, 7, pad=3, Kw=1, pad_w=0, bias=True),  # and its 7x1
    ConvShape(3, 64, 21, 19, 64, 3, pad=2, dilation=2, bias=True),  # a dilated 3x3
    ConvShape(2, 64, 23, 17, 72, 3, stride=2, pad=1, Kw=5, pad_w=4, dilation=2),
    ConvShape(5, 3, 29, 27, 24, 3, pad=3, dilation=3, bias=True),  # 3 channels: the table
    ConvShape(4, 96, 9, 11, 40, 2, pad=1, Kw=3, pad_w=0, groups=2, bias=True),
]
SHAPE_IDS = [f"B{s.B}-{s.brief()}" for s in SHAPES]


def check(variant, shape, rng, epilogue):
    import cupy

    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)  # wgmma off a Hopper GPU
    x, w, b = random_problem(shape, rng, signed=True)
    got = cupy.asnumpy(variant.prepare(shape, w, epilogue, b).run_once(x, cupy))
    result = compare(got, reference_output(x, w, shape, epilogue, b), variant.precision)
    print(f"{variant.name} {shape.brief()} B{shape.B} [{variant.config_for(shape, epilogue).brief()}]"
          f": bound ratio {result.bound_ratio:.3g}")
    assert result.passed, result.reason


@pytest.mark.parametrize("index", range(len(SHAPES)), ids=SHAPE_IDS)
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_rectangular_and_dilated(variant, index, rng):
    check(variant, SHAPES[index], rng, RELU if index % 2 else None)


@pytest.mark.parametrize("index", range(len(SHAPES)), ids=SHAPE_IDS)
@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma", "wgmma-fp16",
                                                              "wgmma-3xtf32")],
                         ids=["wgmma", "wgmma-fp16", "wgmma-3xtf32"])
def test_every_schedule_and_gather(variant, index, rng):
    """The first tiling of each (schedule, gather) the variant offers the layer."""
    shape = SHAPES[index]
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    kinds = {}
    for t in variant.ranked(shape):
        kinds.setdefault((t.schedule, t.gather), t)
    assert ("halo", "tap") not in kinds  # the halo schedule takes square filters only
    for t in kinds.values():
        check(variant.configured(t), shape, rng, RELU)


def test_the_copy_engine_gathers_a_dilated_layer(rng):
    """The im2col box's corners and the taps' offsets for a dilated, rectangular layer."""
    shape = ConvShape(2, 64, 15, 13, 64, 3, pad=2, Kw=5, pad_w=4, dilation=2, bias=True)
    variant = get_variant("wgmma-fp16")
    tma = [t for t in variant.ranked(shape) if t.gather == "tma"]
    if not variant.supports(shape) or not tma:
        pytest.skip("needs a Hopper GPU")
    check(variant.configured(tma[0]), shape, rng, RELU)
    np.testing.assert_equal(shape.Ho, 15)
