"""winograd on a GPU: random general 3x3 stride-1 layers against the float64 reference at the
fp32 bound, its cuBLAS product pinned to FP32, a launch that allocates nothing, and the tuner's
cache feeding its default choice.

Only F(2x2, 3x3) is tested: F(4x4) is not offered (its error fails the fp32 rule, see
convlab/kernels/winograd.py). Run with `pytest -m gpu -s tests/test_gpu_winograd.py` to see
each layer's bound_ratio.
"""

import numpy as np
import pytest

from convlab import tuning
from convlab.bench import tune
from convlab.gpu import timer
from convlab.kernels import RELU
from convlab.kernels.winograd import BLOCKS, MIN_GROUP_CHANNELS, Winograd, fp32_gemm
from convlab.oracle.verify import compare, random_problem, reference_output
from convlab.shapes import ConvShape

pytestmark = pytest.mark.gpu

CUBLAS_TF32_TENSOR_OP_MATH = 3  # cublasMath_t


def random_layer(rng) -> tuple[ConvShape, str | None]:
    """A general 3x3 stride-1 layer: pad 0-2, 1/2/4 groups, odd sizes and channel counts,
    batch 1..9, bias and ReLU each on or off."""
    groups = int(rng.choice([1, 2, 4]))
    pad = int(rng.integers(0, 3))
    cg = int(rng.choice([MIN_GROUP_CHANNELS, 9, 11, 16, 23, 37]))
    mg = int(rng.integers(1, 40))
    h = int(rng.integers(max(1, 3 - 2 * pad), 31))
    w = int(rng.integers(max(1, 3 - 2 * pad), 31))
    shape = ConvShape(int(rng.integers(1, 10)), cg * groups, h, w, mg * groups, 3, pad=pad,
                      groups=groups, bias=bool(rng.integers(0, 2)))
    return shape, RELU if rng.integers(0, 2) else None


def run(variant, shape, x, w, b, epilogue):
    import cupy

    return cupy.asnumpy(variant.prepare(shape, w, epilogue, b).run_once(x, cupy))


def check_layer(variant, shape, epilogue, rng, signed=False):
    x, w, b = random_problem(shape, rng, signed=signed)
    got = run(variant, shape, x, w, b, epilogue)
    check = compare(got, reference_output(x, w, shape, epilogue, b), variant.precision)
    print(f"B{shape.B} {shape.brief()} {epilogue or 'conv'} chunk/block "
          f"{variant.config_for(shape, epilogue).brief()}: bound_ratio {check.bound_ratio:.3g}")
    assert check.passed, check.reason
    return check


@pytest.mark.parametrize("draw", range(24))
def test_random_general_layers_pass_the_fp32_bound(draw, rng):
    shape, epilogue = random_layer(rng)
    check_layer(Winograd(), shape, epilogue, rng, signed=bool(draw % 2))


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("chunk", [1, 2, 4, 9])
def test_every_chunking_and_block_size(chunk, block, rng):
    """Chunks that do not divide the batch leave a partial last chunk."""
    shape = ConvShape(9, 24, 15, 11, 18, 3, pad=1, groups=3, bias=True)
    check_layer(Winograd(chunk=chunk, block=block), shape, RELU, rng)


@pytest.mark.parametrize("shape", [
    ConvShape(1, 8, 3, 3, 1, 3),  # one output, one tile, no padding
    ConvShape(2, 8, 1, 1, 5, 3, pad=1),  # a 1x1 input, all but the centre tap in the padding
    ConvShape(3, 16, 2, 7, 6, 3, pad=2, groups=2, bias=True),  # padding wider than the input
    ConvShape(2, 64, 56, 56, 64, 3, pad=1),  # the ResNet-style layer at batch 2
    ConvShape(2, 384, 13, 13, 256, 3, pad=1, groups=2, bias=True),  # AlexNet conv5 at batch 2
], ids=lambda s: s.brief())
def test_edge_and_target_layers(shape, rng):
    for signed in (False, True):
        check_layer(Winograd(), shape, RELU if shape.bias else None, rng, signed)


def test_gemm_stays_fp32_when_the_process_asks_cublas_for_tf32(rng):
    """With the CuPy handle in TF32 math mode (and CuPy's float32 compute type TF32, which is
    what CUPY_TF32=1 sets), a batched cupy.matmul runs in TF32, the control shows it; the
    variant's product does not, and both settings are restored after each launch."""
    import cupy
    from cupy._core import _routines_linalg as linalg

    handle = cupy.cuda.get_cublas_handle()
    mode, compute = cupy.cuda.cublas.getMathMode(handle), linalg.get_compute_type(np.float32)
    a = cupy.asarray(2 * rng.random((16, 256, 256), dtype=np.float32) - 1)
    b = cupy.asarray(2 * rng.random((16, 256, 1024), dtype=np.float32) - 1)
    exact = cupy.matmul(a.astype(cupy.float64), b.astype(cupy.float64))
    magnitude = cupy.matmul(cupy.abs(a).astype(cupy.float64), cupy.abs(b).astype(cupy.float64))

    def bound_ratio(product):
        """The verification rule's measure for a length-256 sum: FP32 stays below 8, TF32's
        operand rounding (2^-11) lands near 2^13 / 256 = 32 times sqrt(256)*2^-24*sum|a*b|."""
        return float((cupy.abs(product - exact) / (16 * 2.0 ** -24 * magnitude)).max())

    try:
        cupy.cuda.cublas.setMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH)
        linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
        assert bound_ratio(cupy.matmul(a, b)) > 8
        with fp32_gemm():
            assert bound_ratio(cupy.matmul(a, b)) < 8
        # n = 16*9 = 144: TF32 operands would miss the fp32 bound by ~50x
        check_layer(Winograd(), ConvShape(4, 16, 24, 24, 32, 3, pad=1), None, rng, signed=True)
        assert cupy.cuda.cublas.getMathMode(handle) == CUBLAS_TF32_TENSOR_OP_MATH
        assert linalg.get_compute_type(np.float32) == linalg.COMPUTE_TYPE_TF32
    finally:
        linalg.set_compute_type(np.float32, compute)
        cupy.cuda.cublas.setMathMode(handle, mode)


def test_a_launch_allocates_no_device_memory(rng):
    import cupy

    class CountMallocs(cupy.cuda.MemoryHook):
        name = "count-mallocs"

        def __init__(self):
            self.count = 0

        def malloc_preprocess(self, **kwargs):
            self.count += 1

    shape = ConvShape(5, 32, 13, 13, 48, 3, pad=1, groups=2, bias=True)
    x, w, b = random_problem(shape, rng)
    op = Winograd(chunk=2).prepare(shape, w, RELU, b)
    xd = cupy.asarray(x)
    y = cupy.empty(op.output_shape, dtype=cupy.float32)
    op(xd, y)
    hook = CountMallocs()
    with hook:
        op(xd, y)
        cupy.cuda.Device().synchronize()
    assert hook.count == 0


def test_tuned_configuration_becomes_the_default_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    shape = ConvShape(8, 32, 13, 13, 48, 3, pad=1, bias=True)
    policy = timer.TimingPolicy(min_runs=5, max_runs=20, budget_s=0.2)
    result = tune.tune(shape, Winograd(), RELU, policy)
    for candidate in result.candidates:
        print(tune.config_text(candidate.config), candidate.status, candidate.median_ms,
              candidate.bound_ratio)
    assert all(c.passed for c in result.candidates), tune.failure_lines(result)
    best = result.best.config
    assert tuning.lookup(Winograd(), shape, RELU) == best
    assert Winograd().config_for(shape, RELU).as_dict() == best
    assert tuning.lookup(Winograd(), shape, None) is None  # another epilogue, another entry
