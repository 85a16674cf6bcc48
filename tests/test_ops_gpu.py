"""GPU checks of the non-convolution ops: each against its float64 reference on fresh random
inputs (outputs poisoned first), at odd sizes, AlexNet's and the ECE408 models' shapes; the dense
op on every path it can take and against cuBLAS; and two timing checks the lead reads.

Run on a GPU machine with `pytest -m gpu tests/test_ops_gpu.py -s` (-s shows the timings).
"""

import numpy as np
import pytest

from convlab.gpu import hardware, peaks, timer
from convlab.gpu.elements import BFLOAT16, values
from convlab.kernels.igemm.packing import to_bf16_bits
from convlab.ops import (dense, pool, prepare_activation, prepare_dense, prepare_dense_cublas,
                         prepare_lrn, prepare_lrn_max_pool, prepare_max_pool, prepare_softmax,
                         reference_activation, reference_dense, reference_lrn,
                         reference_lrn_max_pool, reference_max_pool, reference_softmax)
from convlab.oracle.verify import compare, poison
from convlab.shapes import channels_last

pytestmark = pytest.mark.gpu

ALEXNET_LRN = (5, 1e-4, 0.75, 1.0)


def run_op(op, x):
    """The op's output for host input x, into a NaN-poisoned device buffer of the op's output
    type."""
    import cupy

    xd = cupy.asarray(x)
    y = cupy.empty(op.output_shape, dtype=op.output_dtype)
    poison(y)
    op(xd, y)
    return cupy.asnumpy(y)


def assert_within_bound(got, ref):
    check = compare(got, ref, "fp32")
    assert check.passed, check.reason


def signed(rng, shape, scale=1.0):
    return (scale * (2 * rng.random(shape, dtype=np.float32) - 1)).astype(np.float32)


# --- max-pool ---------------------------------------------------------------------------------

POOL_CASES = [
    # (input shape, size, stride, activation)
    ((3, 5, 13, 11), 3, 2, None),       # odd sizes, overlapping windows
    ((2, 3, 9, 7), 3, 1, "relu"),       # stride 1
    ((1, 2, 8, 10), 4, 3, "tanh"),      # stride < size, trailing columns dropped
    ((5, 1, 5, 5), 5, 1, None),         # a 1x1 output
    ((2, 4, 7, 7), 2, 2, "tanh"),       # odd input, 2x2/2 drops the last row and column
    ((1, 1, 1, 1), 1, 1, "relu"),
    ((100, 50, 24, 24), 2, 2, "tanh"),  # ECE408 Fall 2017 tanh + pool
    ((1000, 12, 42, 42), 2, 2, "tanh"),  # ECE408 Spring 2018
] + [((b, c, s, s), 3, 2, act) for b in (1, 2, 128) for c, s in ((96, 55), (256, 27), (256, 13))
     for act in (None, "relu")]        # AlexNet pool1, pool2, pool5


@pytest.mark.parametrize("shape,size,stride,act", POOL_CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-{c[1]}s{c[2]}-{c[3]}"
                              for c in POOL_CASES])
def test_max_pool_matches_float64(rng, shape, size, stride, act):
    x = signed(rng, shape, 3.0)
    op = prepare_max_pool(shape, size, stride, act)
    assert op.category == "pool" and op.kernel == "max_pool"
    assert_within_bound(run_op(op, x), reference_max_pool(x, size, stride, act))


# --- LRN, alone and fused with the max-pool after it --------------------------------------------

LRN_PARAMS = {"alexnet": ALEXNET_LRN, "strong": (3, 1.0, 0.75, 2.0), "even": (4, 0.1, 1.5, 1.0),
              "one": (1, 0.5, 0.5, 1.5), "nine": (9, 2.0, 0.75, 1.0)}


def lrn_input(rng, shape, positive):
    # Scaled so that alpha/size * sum x^2 matters at AlexNet's alpha (1e-4): real conv1 outputs
    # after ReLU reach the tens. positive: as after ReLU; else mixed signs.
    x = 30 * rng.random(shape, dtype=np.float32)
    return x if positive else signed(rng, shape, 30.0)


LRN_CASES = [
    ((3, 7, 5, 6), "alexnet"), ((2, 9, 4, 3), "strong"), ((2, 3, 5, 5), "alexnet"),  # C < size
    ((1, 6, 3, 4), "even"), ((1, 5, 2, 3), "one"), ((2, 96, 55, 55), "alexnet"),
    ((2, 256, 27, 27), "alexnet"), ((1, 300, 17, 19), "strong"),
]


@pytest.mark.parametrize("positive", [True, False], ids=["positive", "signed"])
@pytest.mark.parametrize("shape,params", LRN_CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-{c[1]}" for c in LRN_CASES])
def test_lrn_matches_float64(rng, shape, params, positive):
    x = lrn_input(rng, shape, positive)
    op = prepare_lrn(shape, *LRN_PARAMS[params])
    assert op.category == "lrn" and op.kernel == "lrn"
    assert_within_bound(run_op(op, x), reference_lrn(x, *LRN_PARAMS[params]))


LRN_POOL_CASES = [
    ((2, 7, 5, 6), "alexnet", 3, 2), ((1, 9, 11, 13), "strong", 3, 2),
    ((1, 3, 7, 345), "alexnet", 3, 2),   # wider than one tile: several tiles across
    ((2, 5, 40, 9), "even", 2, 2), ((1, 2, 70, 70), "strong", 5, 1),
    ((3, 11, 6, 6), "one", 6, 1),
] + [((b, c, s, s), "alexnet", 3, 2) for b in (1, 2, 128) for c, s in ((96, 55), (256, 27))]


@pytest.mark.parametrize("positive", [True, False], ids=["positive", "signed"])
@pytest.mark.parametrize("shape,params,ps,pst", LRN_POOL_CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-{c[1]}-{c[2]}s{c[3]}"
                              for c in LRN_POOL_CASES])
def test_lrn_max_pool_matches_float64(rng, shape, params, ps, pst, positive):
    x = lrn_input(rng, shape, positive)
    op = prepare_lrn_max_pool(shape, *LRN_PARAMS[params], ps, pst)
    assert op.category == "lrn" and op.kernel == "lrn_max_pool"
    assert_within_bound(run_op(op, x),
                        reference_lrn_max_pool(x, *LRN_PARAMS[params], ps, pst))


@pytest.mark.parametrize("shape", [(128, 96, 55, 55), (128, 256, 27, 27)],
                         ids=["norm1+pool1", "norm2+pool2"])
def test_lrn_max_pool_fused_beats_lrn_then_pool(rng, shape):
    """AlexNet's LRN + max-pool 3x3/2 pairs at batch 128: the fused kernel against the two
    separate ones. Prints each kernel's time, its bytes through device memory per second and
    its floor (those bytes at the measured copy bandwidth)."""
    import cupy

    x = cupy.asarray(lrn_input(rng, shape, True))
    fused = prepare_lrn_max_pool(shape, *ALEXNET_LRN, 3, 2)
    alone = prepare_lrn(shape, *ALEXNET_LRN)
    pool = prepare_max_pool(shape, 3, 2)
    normalised = cupy.empty(shape, dtype=cupy.float32)
    y = cupy.empty(fused.output_shape, dtype=cupy.float32)
    policy = timer.TimingPolicy(min_runs=20, budget_s=2)
    fused_ms = timer.time_device(lambda: fused(x, y), policy).median_ms
    lrn_ms = timer.time_device(lambda: alone(x, normalised), policy).median_ms
    pool_ms = timer.time_device(lambda: pool(normalised, y), policy).median_ms
    n, p = 4 * int(np.prod(shape)), 4 * int(np.prod(fused.output_shape))
    copy_gbps = peaks.ceilings().copy_gbps
    print(f"\n{fused.name} batch {shape[0]}, {shape[1]}x{shape[2]}x{shape[3]} "
          f"(copy bandwidth {copy_gbps:.0f} GB/s):")
    for name, ms, moved in (("fused", fused_ms, n + p), ("LRN", lrn_ms, 2 * n),
                            ("pool", pool_ms, n + p)):
        print(f"  {name:5s} {ms:.4f} ms  {moved / ms / 1e6:5.0f} GB/s  floor "
              f"{moved / copy_gbps / 1e6:.4f} ms")
    print(f"  LRN + pool {lrn_ms + pool_ms:.4f} ms; fused saves {2 * n / 1e6:.0f} MB of traffic")
    assert fused_ms < lrn_ms + pool_ms


# --- dense --------------------------------------------------------------------------------------

def dense_problem(rng, batch, inputs, outputs, positive=False):
    x = (rng.random((batch, inputs), dtype=np.float32) if positive
         else signed(rng, (batch, inputs)))
    w = (rng.standard_normal((outputs, inputs), dtype=np.float32) * np.sqrt(2.0 / inputs)) \
        .astype(np.float32)
    b = (0.1 * rng.standard_normal(outputs, dtype=np.float32)).astype(np.float32)
    return x, w, b


# Every path on shapes that are no multiple of anything: GEMV at each batch width, every tile
# whole and split-K, with K and N odd (scalar loads and stores) and multiples of 4 (float4).
FORCED = [(mb, 37 if mb % 2 else 260, 29 if mb % 3 else 8, "gemv", None, None)
          for mb in range(1, dense.GEMV_MAX_BATCH + 1)]
FORCED += [(m, k, n, "gemm", tile, splits) for tile in dense.TILES for splits in (1, 3)
           for m, k, n in ((130, 37, 150), (70, 264, 68), (33, 1030, 132))]


@pytest.mark.parametrize("act", [None, "relu", "tanh"])
@pytest.mark.parametrize("batch,inputs,outputs,kind,tile,splits", FORCED,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-{c[5]}" for c in FORCED])
def test_dense_every_path_matches_float64(rng, batch, inputs, outputs, kind, tile, splits, act):
    x, w, b = dense_problem(rng, batch, inputs, outputs)
    plan = dense.gemv_plan() if kind == "gemv" else dense.gemm_plan(inputs, tile, splits)
    op = prepare_dense(batch, w, b, act, plan=plan)
    expected_kernels = {"gemv": ("dense_gemv", ()), "gemm": (
        "dense_gemm", ("dense_splitk_reduce",) if plan.splits > 1 else ())}[kind]
    assert (op.kernel, op.extra_kernels) == expected_kernels and op.category == "fc"
    assert_within_bound(run_op(op, x), reference_dense(x, w, b, act))


MODEL_FC = [
    # (batch, in, out, activation): AlexNet fc6-8 at batch 1, 2, 128, the ECE408 models' FCs
    *[(b, 9216, 4096, "relu") for b in (1, 2, 128)],
    *[(b, 4096, 4096, "relu") for b in (1, 2, 128)],
    *[(b, 4096, 1000, None) for b in (1, 2, 128)],
    *[(b, 7200, 500, "tanh") for b in (1, 10, 100, 10000)],
    (10000, 500, 10, None), (7, 5400, 160, "tanh"), (1000, 5400, 160, "tanh"),
    (1000, 160, 10, None),
    (9, 1, 1, None), (300, 3, 5, "relu"), (1, 5, 3, "tanh"),  # degenerate sizes, default plans
]


@pytest.mark.parametrize("batch,inputs,outputs,act", MODEL_FC,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}" for c in MODEL_FC])
def test_dense_and_cublas_match_float64_and_each_other(rng, batch, inputs, outputs, act):
    x, w, b = dense_problem(rng, batch, inputs, outputs, positive=inputs >= 4096)
    ref = reference_dense(x, w, b, act)
    ours = run_op(prepare_dense(batch, w, b, act), x)
    theirs = run_op(prepare_dense_cublas(batch, w, b, act), x)
    assert_within_bound(ours, ref)
    assert_within_bound(theirs, ref)
    # Both within the bound of the float64 result, so within twice of each other.
    assert np.all(np.abs(ours.astype(np.float64) - theirs) <= 2 * ref.bound("fp32"))


def test_dense_fc6_batch_128_within_2x_of_cublas(rng):
    """Our SGEMM (split-K at batch 128) against cuBLAS on AlexNet's fc6; batch 1 (GEMV) and
    1024 (no split) are printed alongside for the record."""
    import cupy

    policy = timer.TimingPolicy(min_runs=20, budget_s=3)
    times = {}
    for batch in (1, 128, 1024):
        x, w, b = dense_problem(rng, batch, 9216, 4096, positive=True)
        xd = cupy.asarray(x)
        y = cupy.empty((batch, 4096), dtype=cupy.float32)
        ours = prepare_dense(batch, w, b, "relu")
        theirs = prepare_dense_cublas(batch, w, b, "relu")
        times[batch] = (timer.time_device(lambda: ours(xd, y), policy).median_ms,
                        timer.time_device(lambda: theirs(xd, y), policy).median_ms)
        plan = dense.plan_dense(batch, 9216, 4096, hardware.current().sms)
        flops = 2 * batch * 9216 * 4096
        print(f"\nfc6 batch {batch:4d} ({plan.describe()}): ours {times[batch][0]:.4f} ms "
              f"({flops / times[batch][0] / 1e9:.0f} GFLOP/s), cuBLAS {times[batch][1]:.4f} ms "
              f"({flops / times[batch][1] / 1e9:.0f} GFLOP/s)")
    assert times[128][0] <= 2 * times[128][1]


# --- softmax and activations --------------------------------------------------------------------

SOFTMAX_CASES = [(1, 1000), (128, 1000), (10000, 10), (3, 1), (5, 33), (2, 2049), (1025, 7)]


@pytest.mark.parametrize("offset", [0.0, 90.0], ids=["centred", "offset90"])
@pytest.mark.parametrize("batch,n", SOFTMAX_CASES, ids=[f"{b}x{n}" for b, n in SOFTMAX_CASES])
def test_softmax_matches_float64(rng, batch, n, offset):
    # offset 90: exp of the raw logits would overflow float32 (above 88.7); the max
    # subtraction must keep every exponent <= 0.
    z = (5 * rng.standard_normal((batch, n), dtype=np.float32) + offset).astype(np.float32)
    op = prepare_softmax(batch, n)
    assert op.category == "softmax" and op.kernel == "softmax_rows"
    assert_within_bound(run_op(op, z), reference_softmax(z))


ACTIVATION_CASES = [((2, 96, 55, 55), "relu"), ((7, 13), "tanh"), ((1,), "relu"),
                    ((5, 500), "tanh"), ((3, 257), "relu")]


@pytest.mark.parametrize("shape,kind", ACTIVATION_CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-{c[1]}" for c in ACTIVATION_CASES])
def test_activation_matches_float64_out_of_place_and_in_place(rng, shape, kind):
    import cupy

    x = signed(rng, shape, 4.0)
    op = prepare_activation(shape, kind)
    assert op.category == "activation" and op.kernel == "activation"
    ref = reference_activation(x, kind)
    assert_within_bound(run_op(op, x), ref)
    inplace = cupy.asarray(x)
    op(inplace, inplace)
    assert_within_bound(cupy.asnumpy(inplace), ref)


# --- channels-last: the same bits as NCHW -----------------------------------------------------

def run_channels_last(op, x):
    """The op's output for host input x (logical NCHW) given to it in channels-last memory,
    returned as logical NCHW."""
    import cupy

    xd = cupy.ascontiguousarray(cupy.asarray(x).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    y = cupy.empty(op.output_shape, dtype=op.output_dtype)
    poison(y)
    op(xd, y)
    return cupy.asnumpy(channels_last(y))


NHWC_CASES = [pytest.param((2, 7, 5, 6), "alexnet", 3, 2, marks=pytest.mark.smoke),
              pytest.param((1, 40, 11, 13), "strong", 3, 2, marks=pytest.mark.smoke),
              ((2, 5, 9, 9), "even", 2, 2), ((3, 33, 6, 6), "one", 6, 1),
              ((2, 96, 55, 55), "alexnet", 3, 2), ((2, 256, 27, 27), "alexnet", 3, 2),
              ((1, 70, 25, 25), "strong", 20, 1),  # a window too large for the NHWC tile
              # the quad kernel: one lane, a 9-channel window, a partial last channel block
              pytest.param((2, 4, 9, 9), "nine", 3, 2, marks=pytest.mark.smoke),
              ((3, 200, 8, 8), "even", 2, 2), ((2, 40, 10, 10), "nine", 3, 1)]


NHWC_IDS = ["7c", "40c", "9x9-2s2", "6s1", "norm1+pool1", "norm2+pool2", "20s1", "4c-size9",
            "200c", "40c-size9"]


@pytest.mark.parametrize("shape,params,ps,pst", NHWC_CASES,
                         ids=NHWC_IDS)
def test_channels_last_pool_and_lrn_give_the_nchw_bits(rng, shape, params, ps, pst):
    """The NHWC kernels sum each LRN window in the NCHW kernels' order (and a max is exact):
    the same bits from either layout, so the NCHW kernels' bounds carry over; the references
    check it too. Channel counts above and below a warp's 32 lanes (the window's shuffles)."""
    x = lrn_input(rng, shape, False)
    params = LRN_PARAMS[params]
    pairs = [(prepare_max_pool(shape, ps, pst, "relu"),
              prepare_max_pool(shape, ps, pst, "relu", "nhwc"),
              reference_max_pool(x, ps, pst, "relu")),
             (prepare_lrn(shape, *params), prepare_lrn(shape, *params, "nhwc"),
              reference_lrn(x, *params)),
             (prepare_lrn_max_pool(shape, *params, ps, pst),
              prepare_lrn_max_pool(shape, *params, ps, pst, "nhwc"),
              reference_lrn_max_pool(x, *params, ps, pst))]
    for nchw, nhwc, ref in pairs:
        assert nhwc.layout == "nhwc"
        got = run_channels_last(nhwc, x)
        assert_within_bound(got, ref)
        assert np.array_equal(got, run_op(nchw, x)), nhwc.name


F32, F16, BF16 = np.float32, np.float16, BFLOAT16


def typed(a, dtype):
    """Float values as `dtype`: bf16 bits rounded to nearest even, any other type by astype."""
    return to_bf16_bits(a) if np.dtype(dtype) == BF16 else a.astype(dtype)


@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, F32), (F32, F16), (F16, F16), (F16, F32),
                                                (BF16, BF16), (BF16, F32), (F32, BF16)])
@pytest.mark.parametrize("shape,size,stride,pad", [
    pytest.param((2, 64, 17, 15), 3, 2, 1, marks=pytest.mark.smoke),  # ResNet's stem pool
    ((3, 64, 16, 12), 2, 2, 0),  # VGG's
    ((1, 24, 9, 9), 3, 1, 1)])
def test_channels_last_pools_of_channel_vectors_give_the_nchw_bits(rng, shape, size, stride,
                                                                   pad, in_dtype, out_dtype):
    """A thread pooling 16 bytes of adjacent channels (pool.channels_per_thread) gives what the
    NCHW kernel, one output a thread, gives: the max is one of the inputs, so the bits agree in
    every element type; windows cut by the padding and activations of either sign included."""
    x = typed(signed(rng, shape), in_dtype)
    assert pool.channels_per_thread(shape[1], "nhwc", in_dtype) > 1
    nhwc = prepare_max_pool(shape, size, stride, "relu", "nhwc", in_dtype, out_dtype, pad)
    nchw = prepare_max_pool(shape, size, stride, "relu", "nchw", in_dtype, out_dtype, pad)
    got = run_channels_last(nhwc, x)
    assert np.array_equal(got, run_op(nchw, x))
    exact = reference_max_pool(values(x), size, stride, "relu", pad).values
    assert np.array_equal(values(got), values(typed(exact, out_dtype)))


@pytest.mark.parametrize("shape,size,stride,pad", [((64, 64, 224, 224), 2, 2, 0),
                                                   ((128, 64, 112, 112), 3, 2, 1)],
                         ids=["vgg16-pool1-b64", "resnet50-stem-pool-b128"])
def test_channels_last_fp16_pools_run_near_the_copy_ceiling(rng, shape, size, stride, pad):
    """A pool reads its input once and writes its output once: VGG-16's first pool and
    ResNet-50's stem pool in fp16, channels-last, move those bytes at 70% of the measured copy
    bandwidth or more. With one channel a thread (2-byte loads) they ran at 63% and 41% on an
    H200 (results/h200/vgg16-pools-20261129/logs/pool-timing.log); 16 bytes a thread, at 103%
    and 84%."""
    import cupy

    x = cupy.asarray(signed(rng, shape).astype(np.float16))
    op = prepare_max_pool(shape, size, stride, None, "nhwc", np.float16, np.float16, pad)
    y = cupy.empty(op.output_shape, dtype=np.float16)
    ms = timer.time_device(lambda: op(x, y), timer.TimingPolicy(min_runs=20, budget_s=2)).median_ms
    moved = x.nbytes + y.nbytes
    copy_gbps = peaks.ceilings().copy_gbps
    print(f"\n{op.name} {shape}: {ms:.4f} ms, {moved / ms / 1e6:.0f} GB/s "
          f"(copy {copy_gbps:.0f} GB/s)")
    assert moved / ms / 1e6 >= 0.7 * copy_gbps


def test_channels_last_pool_refuses_a_misaligned_view():
    import cupy

    shape = (1, 8, 4, 4)
    op = prepare_max_pool(shape, 2, 2, layout="nhwc", in_dtype=F16, out_dtype=F16)
    backing = cupy.zeros(int(np.prod(shape)) + 1, dtype=np.float16)
    shifted = backing[1:].reshape(shape)  # 2 bytes past a 16-byte boundary
    y = cupy.empty(op.output_shape, dtype=np.float16)
    with pytest.raises(ValueError, match="16-byte boundary"):
        op(shifted, y)


# --- fp16 activations (for an fp16 conv after the op) -------------------------------------------

@pytest.mark.parametrize("shape,params,ps,pst", NHWC_CASES,
                         ids=NHWC_IDS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_fp16_outputs_are_the_float32_ones_rounded(rng, shape, params, ps, pst, layout):
    """An op writing fp16 stores exactly what the float32 op computes, rounded to nearest even
    (what the fp16 conv's own conversion would have given); a max-pool or ReLU reading fp16
    computes on its values exactly."""
    x = lrn_input(rng, shape, False)
    x16 = x.astype(np.float16)
    params = LRN_PARAMS[params]
    run = run_channels_last if layout == "nhwc" else run_op
    float_ops = [prepare_max_pool(shape, ps, pst, "relu", layout),
                 prepare_lrn(shape, *params, layout),
                 prepare_lrn_max_pool(shape, *params, ps, pst, layout),
                 prepare_activation(shape, "relu", layout)]
    half_ops = [prepare_max_pool(shape, ps, pst, "relu", layout, out_dtype=np.float16),
                prepare_lrn(shape, *params, layout, out_dtype=np.float16),
                prepare_lrn_max_pool(shape, *params, ps, pst, layout, out_dtype=np.float16),
                prepare_activation(shape, "relu", layout, out_dtype=np.float16)]
    for single, half in zip(float_ops, half_ops):
        got = run(half, x)
        assert got.dtype == np.float16, half.name
        assert np.array_equal(got, run(single, x).astype(np.float16), equal_nan=True), half.name
    exact = run(float_ops[0], x16.astype(np.float32))
    for out in (np.float16, np.float32):
        pool = prepare_max_pool(shape, ps, pst, "relu", layout, np.float16, out)
        assert np.array_equal(run(pool, x16), exact.astype(out)), (pool.name, out)
        act = prepare_activation(shape, "relu", layout, np.float16, out)
        assert np.array_equal(run(act, x16), np.maximum(x16, 0).astype(out)), ("relu", out)
