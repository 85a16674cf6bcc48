"""The depthwise variants on the GPU: depthwise layers at every stride, padding, filter size and
channel count that changes the kernel's vectors, lanes, channel chunks and tiles, each against
float64 with its output poisoned; every tile the tuner may pick; fp16 output; an unstaged input
refused."""

import numpy as np
import pytest

from convlab.errors import ConvlabError
from convlab.kernels import RELU
from convlab.kernels.depthwise import Depthwise, DepthwiseBF16, DepthwiseFP16
from convlab.oracle.verify import compare, random_problem, reference_output
from convlab.shapes import ConvShape

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_cache")]

VARIANTS = [Depthwise(), DepthwiseFP16(), DepthwiseBF16()]
IDS = [v.name for v in VARIANTS]

# (shape, epilogue, signed): each an edge of the strip and vector mapping.
CASES = [
    (ConvShape(3, 32, 13, 11, 32, 3, pad=1, groups=32, bias=True), RELU, True),  # tiles past HO, WO
    (ConvShape(2, 64, 17, 15, 64, 3, stride=2, pad=1, groups=64), None, True),  # MobileNet s2
    (ConvShape(5, 24, 9, 9, 24, 5, pad=2, groups=24, bias=True), None, False),  # 5x5: narrower vec
    (ConvShape(2, 16, 12, 10, 16, 7, pad=3, groups=16), RELU, True),  # ConvNeXt's 7x7: vec 1
    (ConvShape(3, 7, 10, 9, 7, 3, pad=0, groups=7), None, True),  # odd C: 4- and 2-byte copies
    (ConvShape(2, 70, 9, 11, 70, 3, pad=1, groups=70, bias=True), RELU, True),  # partial chunk
    (ConvShape(2, 40, 6, 7, 40, 3, stride=3, pad=2, groups=40), None, False),  # 20 lanes
    (ConvShape(2, 8, 9, 8, 8, 4, stride=3, pad=3, groups=8), None, True),  # even K, pad = K-1
    (ConvShape(1, 128, 3, 3, 128, 3, pad=1, groups=128, bias=True), RELU, True),  # 3x3 output
    (ConvShape(9, 40, 6, 7, 40, 1, groups=40, bias=True), None, True),  # 1x1 depthwise
    (ConvShape(2, 1, 9, 8, 1, 3, pad=1), RELU, True),  # one channel: fp16 copies via registers
]


def case_id(case) -> str:
    shape, epilogue, signed = case
    return f"B{shape.B}-{shape.brief()}-{epilogue or 'conv'}-{'signed' if signed else 'unsigned'}"


def run(variant, shape, epilogue, rng, signed):
    import cupy

    x, w, b = random_problem(shape, rng, signed=signed)
    got = cupy.asnumpy(variant.prepare(shape, w, epilogue, b).run_once(x, cupy))
    return got, compare(got, reference_output(x, w, shape, epilogue, b), variant.precision)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.smoke) if i in (0, 5) else c
                                  for i, c in enumerate(CASES)], ids=case_id)
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_depthwise_layer_matches_float64(variant, case, rng):
    shape, epilogue, signed = case
    assert variant.supports(shape), variant.supports(shape).reason
    _, check = run(variant, shape, epilogue, rng, signed)
    assert check.passed, f"{variant.name} on {shape.describe()}: {check.reason}"


@pytest.mark.parametrize("shape", [ConvShape(2, 32, 11, 13, 32, 3, pad=1, groups=32, bias=True),
                                   ConvShape(3, 16, 19, 9, 16, 5, stride=2, pad=2, groups=16)],
                         ids=lambda s: s.brief())
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_every_tile_the_tuner_tries_is_right(variant, shape, rng):
    """Each of configs() (vectors of 1 to 16 bytes, tiles of 4 to 16 rows and 8 or 16 columns,
    the last ones partial)."""
    configs = variant.configs(shape, RELU)
    assert len(configs) > 4
    for config in configs:
        _, check = run(variant.configured(config), shape, RELU, rng, True)
        assert check.passed, f"{config.brief()}: {check.reason}"


@pytest.mark.smoke
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_an_fp16_output_is_the_float32_output_rounded(variant, rng):
    import cupy

    shape = ConvShape(2, 64, 10, 9, 64, 3, pad=1, groups=64, bias=True)
    x, w, b = random_problem(shape, rng, signed=True)
    outputs = [cupy.asnumpy(v.prepare(shape, w, RELU, b).run_once(x, cupy))
               for v in (variant, variant.writing(np.float16))]
    assert outputs[1].dtype == np.float16
    assert np.array_equal(outputs[1], outputs[0].astype(np.float16))
    check = compare(outputs[1], reference_output(x, w, shape, RELU, b), variant.precision)
    assert check.passed, check.reason


def test_an_unstaged_input_is_refused_with_the_fix(rng):
    import cupy

    shape = ConvShape(2, 16, 8, 8, 16, 3, pad=1, groups=16)
    x, w, _ = random_problem(shape, rng)
    op = DepthwiseFP16().prepare(shape, w)
    y = cupy.full(op.output_shape, cupy.nan, dtype=cupy.float32)
    with pytest.raises(ConvlabError, match="pass op.stage"):
        op(cupy.asarray(x), y)
    op(op.stage(cupy.asarray(x)), y)
    assert bool(cupy.isfinite(y).all())
