"""GPU checks for the pipelined family: each variant against float64 at its precision's bound.

Random general shapes (stride, padding, groups, bias, ReLU, odd sizes, batch 1-9), the AlexNet
layers at batch 2, several tilings each (split-K included), and for pipelined-3xtf32 the fp32
rule on mixed-sign data and its measured margin on same-sign data. Run with `pytest -m gpu -s`
to see the printed bound ratios.
"""

import dataclasses

import numpy as np
import pytest

from convlab.errors import ConvlabError
from convlab.kernels import RELU, pipelined as P
from convlab.kernels.igemm import packing, tiling
from convlab.models import get_model
from convlab.oracle.verify import compare, poison, random_problem, reference_output
from convlab.shapes import ConvShape

pytestmark = pytest.mark.gpu

VARIANTS = [P.Pipelined(), P.Pipelined3xTF32(), P.PipelinedFP16(), P.PipelinedBF16()]
IDS = [v.name for v in VARIANTS]

GENERAL = [
    ConvShape(1, 3, 17, 13, 7, 3),
    ConvShape(2, 5, 19, 23, 9, 5, stride=2, pad=2, bias=True),
    ConvShape(3, 8, 31, 29, 12, 11, stride=4, pad=1, groups=2),
    ConvShape(4, 12, 9, 11, 20, 3, pad=1, groups=4, bias=True),
    ConvShape(5, 7, 14, 10, 33, 1, bias=True),
    ConvShape(6, 16, 8, 8, 48, 3, stride=2, pad=3, groups=2),
    ConvShape(7, 4, 6, 5, 8, 5, pad=2, groups=4, bias=True),
    ConvShape(8, 64, 7, 7, 65, 3, pad=1),  # full 32-channel chunks; M=65: several m-tiles
    ConvShape(9, 96, 5, 5, 40, 3, pad=1, groups=2, bias=True),  # 48 channels per group
    ConvShape(2, 33, 12, 12, 17, 2, stride=2),  # a partial channel chunk
    ConvShape(1, 1, 28, 28, 50, 5),
    ConvShape(9, 20, 3, 3, 10, 3, pad=1, groups=2),
]
ALEXNET = get_model("alexnet").conv_shapes(2)


def run(variant, shape, x, w, b, epilogue):
    import cupy

    return cupy.asnumpy(variant.prepare(shape, w, epilogue, b).run_once(x, cupy))


def check(variant, shape, rng, epilogue=RELU, signed=True):
    x, w, b = random_problem(shape, rng, signed=signed)
    got = run(variant, shape, x, w, b, epilogue)
    result = compare(got, reference_output(x, w, shape, epilogue, b), variant.precision)
    config = variant.config_for(shape).brief()
    print(f"{variant.name} {shape.brief()} B{shape.B} [{config}]: bound ratio "
          f"{result.bound_ratio:.3g}, max rel {result.max_rel_error:.3g}")
    return result


@pytest.mark.parametrize("index", range(len(GENERAL)),
                         ids=[f"B{s.B}-{s.brief()}" for s in GENERAL])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_general_shapes(variant, index, rng):
    shape = GENERAL[index]
    result = check(variant, shape, rng, RELU if index % 2 else None, signed=index % 3 != 0)
    assert result.passed, result.reason


@pytest.mark.parametrize("layer", list(ALEXNET))
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_alexnet_layers_at_batch_2(variant, layer, rng):
    result = check(variant, ALEXNET[layer], rng, RELU, signed=False)
    assert result.passed, result.reason


CONFIG_SHAPES = [ALEXNET["conv2"], ALEXNET["conv1"], GENERAL[3], GENERAL[9]]


@pytest.mark.parametrize("shape", CONFIG_SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_several_tilings(variant, shape, rng):
    """The first six tilings configs() offers, and its first split-K one, not only the
    heuristic's choice."""
    configs = variant.configs(shape, RELU)
    chosen = configs[:6] + [c for c in configs[6:] if c.split_k > 1][:1]
    failures = []
    for config in chosen:
        result = check(variant.configured(config), shape, rng, RELU)
        if not result.passed:
            failures.append(f"{tiling.Tiling.from_dict(config).brief()}: {result.reason}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_split_k_is_deterministic_and_rearms_its_counters(variant, rng):
    """Two runs give identical bits: the last block sums the partials in split order, and
    resets the tile counters for the next launch (else the second run would miscount)."""
    import cupy

    shape = ConvShape(2, 64, 9, 9, 32, 3, pad=1, bias=True)
    config = next(c for c in variant.configs(shape, RELU) if c.split_k > 1)
    v = variant.configured(config)
    x, w, b = random_problem(shape, rng, signed=True)
    op = v.prepare(shape, w, RELU, b)
    xs = op.stage(cupy.asarray(x))
    outputs = []
    for _ in range(2):
        y = cupy.empty(op.output_shape, dtype=cupy.float32)
        poison(y)
        op(xs, y)
        outputs.append(cupy.asnumpy(y))
    assert np.array_equal(outputs[0], outputs[1])
    result = compare(outputs[1], reference_output(x, w, shape, RELU, b), v.precision)
    assert result.passed, result.reason


@pytest.mark.parametrize("layer", ["conv3", "conv4"])
def test_3xtf32_passes_the_fp32_rule_on_mixed_signs(layer, rng):
    result = check(P.Pipelined3xTF32(), ALEXNET[layer], rng, None, signed=True)
    assert result.passed, result.reason


def test_3xtf32_margin_on_same_sign_data_at_reduction_4608(rng):
    """x, w >= 0 at n = 4,608: errors of one sign add up. The bound ratio is printed for the
    precision label; the assertion only separates arithmetic from a bug: one wrong or missing
    term is off by ~sum|x*w|/n, 1/(8 n^1.5 u) = 6.7x the fp32 bound here."""
    shape = ConvShape(2, 512, 6, 6, 64, 3, pad=1)
    assert shape.reduction == 4608
    variant = P.Pipelined3xTF32()
    split = next(c for c in variant.configs(shape) if c.split_k > 1)
    unsplit = dataclasses.replace(split, split_k=1)  # one block sums all 4,608 terms
    for config in (unsplit, split):
        v = variant.configured(config)
        x = rng.random(shape.input_shape, dtype=np.float32)
        w = np.abs(rng.standard_normal(shape.weight_shape) / np.sqrt(4608)).astype(np.float32)
        result = compare(run(v, shape, x, w, None, None), reference_output(x, w, shape, None),
                         "fp32")
        print(f"pipelined-3xtf32 same-sign n=4608 [{v.config_for(shape).brief()}]: bound ratio "
              f"{result.bound_ratio:.3g}, max rel {result.max_rel_error:.3g}, "
              f"{result.exceeded} elements over the fp32 bound")
        assert result.bound_ratio < 4.0, result.reason


def test_staging_converts_once_and_unstaged_input_is_refused(rng):
    import cupy

    shape = ConvShape(2, 8, 9, 9, 16, 3, pad=1)
    x, w, _ = random_problem(shape, rng, signed=True)
    x[0, 0, 0, :4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 0.0]  # bf16 ties to even
    xd = cupy.asarray(x)
    fp16 = P.PipelinedFP16().prepare(shape, w)
    staged = fp16.stage(xd)
    assert staged.dtype == np.float16 and np.array_equal(cupy.asnumpy(staged), x.astype(np.float16))
    bf16 = P.PipelinedBF16().prepare(shape, w)
    staged = bf16.stage(xd)
    assert staged.dtype == np.uint16 and np.array_equal(cupy.asnumpy(staged), packing.to_bf16_bits(x))
    y = cupy.empty(shape.output_shape, dtype=cupy.float32)
    with pytest.raises(ConvlabError, match="op.stage"):
        fp16(xd, y)
    tf32 = P.Pipelined().prepare(shape, w)
    assert tf32.stage(xd) is xd
