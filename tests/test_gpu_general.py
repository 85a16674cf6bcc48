"""General conv layers (stride, zero padding, groups, bias, fused ReLU) in every GPU variant.

The GPU tests (marker gpu) run each variant in VARIANTS on odd-sized layers with stride 2 and 4,
padding 1-3, 1/2/4 groups, with and without a bias, under epilogue None, ReLU and (where a
variant has it) tanh-pool, and on AlexNet's five conv layers at batch 2; outputs are poisoned
with NaN and checked element by element against float64. A variant that does not support a
case is skipped with its own reason. The support checks at the end need no GPU.
"""

import numpy as np
import pytest

from convlab.errors import ConvlabError
from convlab.kernels import RELU, TANH_POOL, VARIANTS
from convlab.models import MODELS
from convlab.oracle.verify import compare, random_problem, reference_output
from convlab.shapes import ConvShape

GPU_VARIANTS = [v for v in VARIANTS.values() if v.on_gpu]

# (shape, epilogue, signed inputs): each chosen for an edge a kernel's index mapping can miss.
HAND_PICKED = [
    (ConvShape(1, 3, 13, 11, 5, 3, stride=2, pad=1), None, False),  # odd sizes, one image
    (ConvShape(3, 4, 17, 15, 8, 5, stride=2, pad=2, groups=2, bias=True), RELU, True),
    (ConvShape(2, 3, 31, 29, 16, 11, stride=4, bias=True), None, True),  # conv1-like, bias only
    (ConvShape(5, 8, 9, 9, 12, 3, pad=1, groups=4, bias=True), RELU, False),  # 3 channels a group
    # 70 channels a group: a group spans several channel blocks, its last one partial; pad >= K.
    (ConvShape(4, 6, 10, 7, 140, 3, pad=3, groups=2, bias=True), None, True),
    (ConvShape(7, 5, 12, 13, 10, 4, stride=4, pad=3), RELU, True),  # even K; ReLU, no bias
    (ConvShape(9, 40, 8, 11, 24, 3, pad=1, groups=2, bias=True), RELU, True),  # 9 images
    (ConvShape(3, 12, 6, 13, 36, 1, stride=2, groups=4, bias=True), None, False),  # 1x1, stride 2
    (ConvShape(2, 24, 11, 9, 24, 3, stride=2, pad=1, groups=24, bias=True), RELU, True),  # depthwise
]
TANH_POOL_CASES = [(shape, TANH_POOL, signed) for shape, _, signed in HAND_PICKED[1:4]]


def random_shapes(count: int, seed: int) -> list[ConvShape]:
    """Layers drawn from a fixed seed (so test ids are stable): odd sizes, K in 1..7, stride 1/2/4,
    padding 0-3, 1/2/4 groups, 1-9 images, a bias on about half of them."""
    draw = np.random.default_rng(seed)
    shapes = []
    while len(shapes) < count:
        groups = int(draw.choice([1, 2, 4]))
        K = int(draw.choice([1, 2, 3, 5, 7]))
        try:
            shapes.append(ConvShape(
                int(draw.integers(1, 10)), groups * int(draw.integers(1, 7)),
                2 * int(draw.integers(2, 16)) + 1, 2 * int(draw.integers(2, 16)) + 1,
                groups * int(draw.integers(1, 21)), K, stride=int(draw.choice([1, 2, 4])),
                pad=int(draw.integers(0, 4)), groups=groups, bias=bool(draw.integers(0, 2))))
        except ConvlabError:  # the kernel does not fit the padded input
            continue
    return shapes


RANDOM = [(shape, (None, RELU)[i % 2], i % 2 == 0) for i, shape in enumerate(random_shapes(4, 36))]
ALEXNET = MODELS["alexnet"].conv_shapes(2)
ALEXNET_CASES = [(shape, RELU, name == "conv1") for name, shape in ALEXNET.items()]
CASES = HAND_PICKED + TANH_POOL_CASES + RANDOM + ALEXNET_CASES


def case_id(case) -> str:
    shape, epilogue, signed = case
    return f"B{shape.B}-{shape.brief()}-{epilogue or 'conv'}-{'signed' if signed else 'unsigned'}"


def run_op(variant, shape, x, w, bias, epilogue):
    import cupy

    return cupy.asnumpy(variant.prepare(shape, w, epilogue, bias).run_once(x, cupy))


def skip_unless_supported(variant, shape, epilogue):
    support = variant.supports(shape)
    if support and epilogue is not None:
        support = variant.supports_epilogue(shape, epilogue)
    if not support:
        print(f"{variant.name} skips {shape.brief()} ({epilogue or 'conv'}): {support.reason}")
        pytest.skip(support.reason)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_general_layer_matches_float64(variant, case, rng):
    shape, epilogue, signed = case
    skip_unless_supported(variant, shape, epilogue)
    x, w, bias = random_problem(shape, rng, signed=signed)
    got = run_op(variant, shape, x, w, bias, epilogue)
    check = compare(got, reference_output(x, w, shape, epilogue, bias), variant.precision)
    assert check.passed, f"{variant.name} on {shape.describe()} ({epilogue or 'conv'}): {check.reason}"


# --- which variants take AlexNet's layers (no GPU needed) --------------------------------------

ALEXNET_FULL = MODELS["alexnet"].conv_shapes(1024)


@pytest.mark.parametrize("name", list(ALEXNET_FULL))
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_support_for_alexnet_is_a_yes_or_a_reason(variant, name):
    support = variant.supports(ALEXNET_FULL[name])
    assert support.ok or support.reason.strip(), (variant.name, name)


@pytest.mark.parametrize("name", list(ALEXNET_FULL))
def test_expected_variants_run_alexnet(name):
    shape = ALEXNET_FULL[name]
    expected = ["naive", "implicit-gemm", "tensorcore", "tensorcore-3xtf32", "im2col"]
    if name != "conv1":
        expected.append("register-tiled")
    refused = {v: VARIANTS[v].supports(shape).reason for v in expected if not VARIANTS[v].supports(shape)}
    assert not refused, refused
    assert all(RELU in VARIANTS[v].epilogues for v in expected)
