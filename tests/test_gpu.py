"""GPU checks: every variant against float64 on fresh random inputs, and in the real network.

Run on a GPU machine with `pytest -m gpu`; without CuPy or a GPU these tests skip.
"""

import numpy as np
import pytest

from convlab.bench import lab
from convlab.gpu import hardware, peaks, timer
from convlab.kernels import REFERENCE_VARIANTS, TANH_POOL, VARIANTS
from convlab.models import FASHION_MNIST, MODELS, load_weights
from convlab.net import network as net
from convlab.net.plan import plan_network
from convlab.oracle.verify import compare, poison, random_problem, reference_output
from convlab.shapes import ConvShape

pytestmark = pytest.mark.gpu

GPU_VARIANTS = [v for v in VARIANTS.values() if v.on_gpu]

SHAPES = [
    pytest.param(ConvShape(1, 1, 28, 28, 50, 5), marks=pytest.mark.smoke),  # B=1, C=1: Fall 2017
    ConvShape(7, 1, 48, 48, 12, 7),      # Spring 2018 conv1
    ConvShape(3, 12, 21, 21, 24, 7),     # Spring 2018 conv2, C > 1
    ConvShape(5, 3, 17, 13, 10, 3),      # odd H and W, H != W, K=3, M=10
    ConvShape(33, 4, 11, 19, 7, 5),      # B=33, M=7 (no multiple of any tile)
    pytest.param(ConvShape(2, 2, 9, 30, 65, 3), marks=pytest.mark.smoke),  # M=65: >1 channel block
    ConvShape(131, 1, 28, 28, 50, 5),    # B=131: the last block is partial
    ConvShape(4, 16, 14, 14, 33, 5),     # C=16, M=33
    ConvShape(2, 5, 10, 8, 12, 1),       # K=1
    ConvShape(3, 1, 5, 5, 3, 5),         # a 1x1 output
]


def run_variant(variant, shape, x, w, epilogue=None, b=None):
    import cupy

    return cupy.asnumpy(variant.prepare(shape, w, epilogue, b).run_once(x, cupy))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_variant_matches_float64_reference(variant, shape, rng):
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    x, w, b = random_problem(shape, rng)
    got = run_variant(variant, shape, x, w)
    check = compare(got, reference_output(x, w, shape, None), variant.precision)
    assert check.passed, check.reason


# Reductions C*K*K from 25 to 512x3x3 = 4,608 (and 1024x3x3): the verification rule holds a
# correct kernel to a bound that grows with the reduction, so none of them may FAIL.
LONG_REDUCTIONS = [ConvShape(3, 1, 20, 20, 16, 5), ConvShape(2, 12, 21, 21, 24, 7),
                   ConvShape(2, 96, 15, 15, 32, 5), ConvShape(2, 512, 9, 9, 32, 3),
                   ConvShape(1, 1024, 7, 7, 16, 3)]


@pytest.mark.parametrize("signed", [True, False], ids=["mixed-sign", "x-positive"])
@pytest.mark.parametrize("shape", LONG_REDUCTIONS, ids=lambda s: f"n{s.reduction}")
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_correct_variants_pass_long_reductions(variant, shape, signed, rng):
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    x, w, _ = random_problem(shape, rng, signed=signed)
    got = run_variant(variant, shape, x, w)
    check = compare(got, reference_output(x, w, shape, None), variant.precision)
    print(f"{variant.name} n={shape.reduction} {'signed' if signed else 'x>=0'}: "
          f"bound ratio {check.bound_ratio:.3g}, max rel err {check.max_rel_error:.3g}")
    assert check.passed, check.reason


@pytest.mark.parametrize("shape", [LONG_REDUCTIONS[3], LONG_REDUCTIONS[4]], ids=lambda s: f"n{s.reduction}")
@pytest.mark.parametrize("name", ["tensorcore-3xtf32", "pipelined-3xtf32"])
def test_split_tf32_on_same_sign_data_meets_its_label(name, shape, rng):
    """The 3xTF32 variants on data whose products all have one sign: the tensor cores truncate
    inside their accumulation, so an accumulator carried through every k-step errs like n*u.
    Measured on an H100: tensorcore-3xtf32 1.5x the fp32 bound at n=4,608 and 2.0x at 9,216, so
    it is labelled tf32; pipelined-3xtf32 adds each K-tile's products into the running sum with
    an ordinary (rounded) FP32 add and stays at 0.02: fp32. Each must meet its own label."""
    variant = VARIANTS[name]
    x = rng.random(shape.input_shape, dtype=np.float32)
    w = rng.random(shape.weight_shape, dtype=np.float32) / shape.reduction
    got = run_variant(variant, shape, x, w)
    ref = reference_output(x, w, shape, None)
    print(f"{name} same-sign n={shape.reduction}: fp32 bound ratio "
          f"{compare(got, ref, 'fp32').bound_ratio:.3g}")
    check = compare(got, ref, variant.precision)
    assert check.passed, check.reason


EPILOGUE_SHAPES = [ConvShape(3, 1, 28, 28, 50, 5), ConvShape(5, 1, 48, 48, 12, 7),
                   ConvShape(4, 3, 12, 11, 7, 3), ConvShape(33, 2, 10, 9, 13, 4),
                   ConvShape(1, 1, 6, 7, 1, 5)]


@pytest.mark.smoke
@pytest.mark.parametrize("variant", [v for v in GPU_VARIANTS if "relu" in v.epilogues
                                     and v.name not in REFERENCE_VARIANTS], ids=lambda v: v.name)
def test_relu_epilogue_keeps_a_wrong_element_visible(variant, rng):
    """An output computed from a NaN stays NaN through the fused bias + ReLU (fmaxf would have
    turned it into 0, and a wrongly computed element into a plausible one)."""
    shape = ConvShape(2, 16, 9, 9, 8, 3, pad=1, bias=True)
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    x, w, b = random_problem(shape, rng, signed=True)
    x[1, 2, 4, 4] = np.nan
    ref = reference_output(x, w, shape, "relu", b).values
    out = run_variant(variant, shape, x, w, "relu", b)
    assert np.isnan(ref).any()
    assert np.isnan(out[np.isnan(ref)]).all(), f"{variant.name}: a NaN output became a number"


@pytest.mark.parametrize("shape", EPILOGUE_SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", [v for v in GPU_VARIANTS if TANH_POOL in v.epilogues],
                         ids=lambda v: v.name)
def test_tanh_pool_epilogue_matches_reference(variant, shape, rng):
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    x, w, _ = random_problem(shape, rng)
    got = run_variant(variant, shape, x, w, TANH_POOL)
    check = compare(got, reference_output(x, w, shape, TANH_POOL), variant.precision)
    assert check.passed, check.reason


@pytest.mark.parametrize("name", ["constant", "unrolled"])
def test_constant_memory_ops_of_one_shape_keep_their_own_weights(name, rng):
    """Two models with the same conv shape share one compiled module (and constant bank)."""
    import cupy

    variant = VARIANTS[name]
    shape = ConvShape(4, 1, 28, 28, 50, 5)
    x, w1, _ = random_problem(shape, rng)
    _, w2, _ = random_problem(shape, rng)
    op1, op2 = variant.prepare(shape, w1), variant.prepare(shape, w2)
    xd = cupy.asarray(x)
    y = cupy.empty(shape.output_shape, dtype=cupy.float32)
    for op, w in ((op1, w1), (op2, w2), (op1, w1)):
        poison(y)
        op(xd, y)
        assert compare(cupy.asnumpy(y), reference_output(x, w, shape, None), "fp32").passed


@pytest.mark.parametrize("model", [m for m, s in MODELS.items() if s.task == FASHION_MNIST])
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_network_reproduces_cpu_accuracy(variant, model):
    spec_shapes = MODELS[model].conv_shapes(10000).values()
    if not all(variant.supports(s) for s in spec_shapes):
        pytest.skip("variant does not support this model's layers")
    policy = timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3)
    result = lab.run(lab.network_plan(MODELS[model], variant, 10000), policy)
    failures = [f"{layer.label}: {layer.check.reason}" for layer in result.layers if not layer.check.passed]
    assert not failures, failures
    expected = load_weights(model).expected_accuracy[10000]
    if variant.precision == "fp32":
        assert result.predictions_differ == 0
        assert result.accuracy == expected
    else:
        # Reduced precision may flip near-ties; the count is reported, and must stay small.
        assert result.predictions_differ <= 100, result.predictions_differ


@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_alexnet_top1_matches_float64(variant, tmp_path, monkeypatch):
    """Every variant that runs AlexNet's conv layers, in the whole network (our pool, LRN and FC
    kernels around it) at batch 8: every layer verified, and fp32 variants give the float64
    forward pass's top-1 on every image."""
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    if not all(variant.supports(s) for s in MODELS["alexnet"].conv_shapes(8).values()):
        pytest.skip("variant does not support every AlexNet layer")
    policy = timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3)
    result = lab.run(lab.network_plan(MODELS["alexnet"], variant, 8), policy)
    failures = [f"{layer.label}: {layer.check.reason}" for layer in result.layers if not layer.check.passed]
    failures += [f"{s.label}: {s.check.reason}" for s in result.steps if s.check and not s.check.passed]
    assert not failures, failures
    print(f"{variant.name}: forward {result.forward_ms:.3f} ms (graph {result.graph}), "
          f"max |p - p64| {result.max_prob_error:.2g}, {result.predictions_differ} top-1 differ")
    if variant.precision == "fp32":
        assert result.predictions_differ == 0


@pytest.mark.smoke
def test_timing_uses_events_and_stops(rng):
    import cupy

    a = cupy.asarray(rng.random((2048, 2048), dtype=np.float32))
    timing = timer.time_device(lambda: a @ a, timer.TimingPolicy(min_runs=5, budget_s=1))
    assert timing.n >= 5 and timing.median_ms > 0 and timing.stop in ("converged", "budget", "max-runs")
    assert timing.method == timer.QUEUED and timing.launches > 1
    cold = timer.time_device(lambda: a @ a, timer.TimingPolicy(min_runs=3, cold=True, budget_s=1))
    assert cold.cold and cold.n >= 3 and cold.launches == 1


TINY_KERNEL = r"""
extern "C" __global__ void scale(float* y, const float* x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


@pytest.mark.smoke
def test_queued_timing_keeps_the_hosts_dispatch_out(rng):
    """A kernel of a few microseconds, launched through a deliberately slow host path (as
    PyTorch's dispatch and DLPack are for the cuDNN rows): one launch between two events on an
    idle GPU times the host; the queued burst times the kernel."""
    import time

    import cupy

    from convlab.gpu.jit import load_module

    kernel = load_module("test:scale", TINY_KERNEL, (), ("scale",)).module.get_function("scale")
    x = cupy.asarray(rng.random(4096, dtype=np.float32))
    y = cupy.empty_like(x)

    def launch():
        deadline = time.perf_counter() + 50e-6  # 50 us of host work before each launch
        while time.perf_counter() < deadline:
            pass
        kernel((4,), (1024,), (y, x, np.int32(x.size)))

    single = timer.time_device(launch, timer.TimingPolicy(method=timer.SINGLE, min_runs=20))
    queued = timer.time_device(launch, timer.TimingPolicy(min_runs=20))
    print(f"single {single.median_ms * 1e3:.1f} us, queued {queued.median_ms * 1e3:.1f} us "
          f"({queued.launches} launches a sample, {queued.drained} drained)")
    assert single.median_ms > 0.04  # the host's 50 us are in it
    assert queued.median_ms < 0.02 and queued.median_ms < single.median_ms / 4
    assert queued.launches > 1
    assert cupy.allclose(y, 2 * x)


@pytest.mark.smoke
@pytest.mark.parametrize("name", ["cudnn-nhwc", "cudnn-nhwc-fp16"])
def test_cudnn_channels_last_rows_read_and_write_nhwc_and_pick_a_relu(name, rng):
    """The channels-last rows get NHWC tensors (staged outside the time) and return cuDNN's
    NHWC output; with a ReLU epilogue the faster of fused conv-bias-ReLU and conv-then-ReLU is
    kept and named."""
    import cupy

    from convlab.kernels.cudnn import CONV_THEN_RELU, FUSED_RELU

    shape = ConvShape(4, 16, 13, 13, 24, 3, pad=1, bias=True)
    x, w, b = random_problem(shape, rng, signed=True)
    op = VARIANTS[name].prepare(shape, w, "relu", b)
    assert op.note in (CONV_THEN_RELU, FUSED_RELU)
    staged = op.stage(cupy.asarray(x))
    assert staged.strides[1] == staged.itemsize  # channels innermost
    got = op.run_once(x, cupy)
    check = compare(cupy.asnumpy(got).astype(np.float32),
                    reference_output(x, w, shape, "relu", b), VARIANTS[name].precision)
    assert check.passed, check.reason


@pytest.mark.smoke
@pytest.mark.parametrize("name", ["cublas-gemm", "cublas-gemm-tf32", "cublas-gemm-fp16",
                                  "cublas-gemm-bf16"])
@pytest.mark.parametrize("epilogue,bias", [("relu", True), (None, True), ("relu", False)])
def test_cublas_gemm_rows_compute_a_1x1_layer(name, epilogue, bias, rng):
    """The GEMM rows read the channels-last input as (pixels x channels), add the bias (and
    ReLU) in or after the product, and hand back channels-last (B, M, H, W) outputs that meet
    the class's bound; with a ReLU they name which of the two ways they kept. PyTorch's matmul
    switches are as they were afterwards (a PyTorch baseline in the process keeps its own)."""
    import cupy

    torch = pytest.importorskip("torch")
    matmul = torch.backends.cuda.matmul
    switches = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                "allow_bf16_reduced_precision_reduction")
    before = [getattr(matmul, s) for s in switches]
    variant = VARIANTS[name]
    shape = ConvShape(5, 24, 13, 11, 40, 1, bias=bias)
    x, w, b = random_problem(shape, rng, signed=True)
    op = variant.prepare(shape, w, epilogue, b)
    if epilogue:
        assert op.note in (variant.plain_note, variant.fused_note)
    got = op.run_once(x, cupy)
    assert got.shape == (5, 40, 13, 11) and got.strides[1] == got.itemsize
    check = compare(cupy.asnumpy(got).astype(np.float32),
                    reference_output(x, w, shape, epilogue, b), variant.precision)
    assert check.passed, check.reason
    assert [getattr(matmul, s) for s in switches] == before


def test_pytorch_candidates_for_the_whole_network():
    """run --pytorch times PyTorch in both layouts, eager, graphed and compiled (and
    channels-last with max-autotune), checks each one's top-1, and takes the fastest as the
    baseline."""
    policy = timer.TimingPolicy(warmup=1, min_runs=3, max_runs=5, budget_s=0.5)
    result = lab.run(lab.network_plan(MODELS["ece408"], "tiled", 100), policy,
                     compare_torch=True)
    rows = result.torch_rows
    assert {(r["layout"], r["mode"]) for r in rows} == {
        (layout, mode) for layout in ("nchw", "nhwc") for mode in ("eager", "graph", "compile")
    } | {("nhwc", "max-autotune")}
    for r in rows:
        print(r)
    measured = [r for r in rows if r["ms"] is not None]
    assert len(measured) >= 4  # eager and graph run wherever PyTorch does
    assert result.torch_ms == min(r["ms"] for r in measured)
    assert all(r["differ"] == 0 for r in measured if r["precision"] == "fp32")


def test_a_pytorch_candidate_past_its_compile_budget_is_skipped_and_the_rest_stand(monkeypatch):
    """max-autotune compiles in a child process that is ended at the budget; the run goes on
    with the other candidates and says why that one has no time."""
    pytest.importorskip("torch")
    from convlab.net import torch_forward

    monkeypatch.setattr(torch_forward, "COMPILE_BUDGET_S", 1.0)
    # a budget the environment names stands over the module's (a GPU machine may set one)
    monkeypatch.delenv(torch_forward.BUDGET_ENV, raising=False)
    policy = timer.TimingPolicy(warmup=1, min_runs=3, max_runs=5, budget_s=0.5)
    result = lab.run(lab.network_plan(MODELS["ece408"], "tiled", 100), policy,
                     compare_torch=True)
    (skipped,) = [r for r in result.torch_rows if r["mode"] == "max-autotune"]
    assert skipped["ms"] is None
    assert skipped["error"].startswith("skipped: not done within its budget of 1 s")
    assert result.torch_ms is not None and "max-autotune" not in result.torch_note


def test_device_info_and_ceilings(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    info = hardware.device_info()
    assert info["name"] and info["compute_capability"]
    first = peaks.ceilings()
    assert first.copy_gbps > 100 and first.fp32_gflops > 1000 and first.tf32_gflops > first.fp32_gflops
    assert peaks.ceilings() == first  # cached on disk
    assert list(tmp_path.glob("ceilings-*.json"))
    if info["compute_capability"] == "9.0":  # wgmma outruns mma.sync, and the floor uses it
        assert first.wgmma_fp16_gflops > first.fp16_gflops and first.wgmma_tf32_gflops > first.tf32_gflops
        assert first.rate("fp16") == first.wgmma_fp16_gflops
    else:
        assert first.wgmma_fp16_gflops is None


# --- convlab compare on the GPU, with deliberately broken test-only variants ----------------

from convlab.bench import compare as compare_mod  # noqa: E402
from convlab.kernels.base import Op  # noqa: E402
from convlab.kernels.naive import Naive  # noqa: E402


BUGGY_SOURCE = r"""
// The course's naive kernel with one bug switched on by a define (tests only).
extern "C" __global__ void conv_forward(const float* x, const float* k, float* y,
                                        int B, int C, int H, int W, int M, int K)
{
    const int Ho = H - K + 1, Wo = W - K + 1;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)B * M * Ho * Wo) return;
    const int w = (int)(i % Wo), h = (int)((i / Wo) % Ho), m = (int)((i / ((long long)Wo * Ho)) % M);
    const long long b = i / ((long long)Wo * Ho * M);
    float acc = 0.0f;
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q) {
#if BUG == 1  // one filter tap never read
                if (p == K - 1 && q == K - 1) continue;
#endif
                int row = h + p;
#if BUG == 2  // the last filter row reads the input row below its own
                if (p == K - 1) row = min(row + 1, H - 1);
#endif
                long long tap = ((m * C + c) * K + p) * K + q;
#if BUG == 3  // a single wrong weight index
                if (c == 0 && p == 0 && q == 0) tap += 1;
#endif
                acc += x[((b * C + c) * H + row) * W + w + q] * k[tap];
            }
#if BUG == 4  // the last output row is never written
    if (h == Ho - 1) return;
#endif
#if BUG == 5  // the last output channel is never written
    if (m == M - 1) return;
#endif
    y[i] = acc;
}
"""
BUGS = {0: "none (control)", 1: "one filter tap skipped", 2: "one input row off by one",
        3: "a single wrong weight index", 4: "the last output row unwritten",
        5: "the last output channel unwritten"}


@pytest.mark.parametrize("shape", [ConvShape(4, 1, 20, 20, 16, 5), ConvShape(2, 512, 9, 9, 16, 3)],
                         ids=lambda s: f"n{s.reduction}")
@pytest.mark.parametrize("bug", list(BUGS), ids=lambda b: BUGS[b])
def test_broken_kernels_fail_on_short_and_long_reductions(bug, shape, rng):
    import cupy

    from convlab.gpu.jit import load_module

    kernel = load_module(f"test-bug-{bug}", BUGGY_SOURCE, ("-std=c++17", f"-DBUG={bug}"),
                         ("conv_forward",)).module.get_function("conv_forward")
    x, w, _ = random_problem(shape, rng, signed=True)
    y = cupy.full(shape.output_shape, cupy.nan, dtype=cupy.float32)
    total = int(np.prod(shape.output_shape))
    sizes = tuple(np.int32(v) for v in (shape.B, shape.C, shape.H, shape.W, shape.M, shape.K))
    kernel(((total + 255) // 256,), (256,), (cupy.asarray(x), cupy.asarray(w), y) + sizes)
    check = compare(cupy.asnumpy(y), reference_output(x, w, shape, None), "fp32")
    if bug == 0:
        assert check.passed, check.reason
    else:
        assert not check.passed, f"{BUGS[bug]} passed at n={shape.reduction}"


def _broken(source: str, old: str, new: str) -> str:
    assert old in source, f"the naive source no longer contains {old!r}: update this test"
    return source.replace(old, new)


class SkipsLastTap(Naive):
    name = "test-wrong"
    source = _broken(Naive.source, "q < K; ++q", "q < K - 1; ++q")


class SkipsLastColumn(Naive):
    name = "test-unwritten"
    source = _broken(Naive.source, "    y[i] = acc;", "    if (w != Wo - 1) y[i] = acc;")


class FirstCallOnly(Naive):
    """Computes on its first call and does nothing afterwards: a cheat of the timer."""

    name = "test-first-call-only"

    def prepare(self, shape, weights, epilogue=None, bias=None):
        real = super().prepare(shape, weights, epilogue, bias)
        calls = []

        def launch(x, y):
            if not calls:
                real(x, y)
            calls.append(1)

        return Op(launch, real.output_shape, real.compile_seconds)


@pytest.fixture
def broken_variants(monkeypatch):
    for cls in (SkipsLastTap, SkipsLastColumn, FirstCallOnly):
        monkeypatch.setitem(VARIANTS, cls.name, cls())
    return [cls.name for cls in (SkipsLastTap, SkipsLastColumn, FirstCallOnly)]


def test_compare_passes_real_variants_and_catches_broken_ones(broken_variants):
    layers = MODELS["ece408"].conv_shapes(100).values()
    fp32 = [v.name for v in GPU_VARIANTS if v.precision == "fp32"
            and v.name not in REFERENCE_VARIANTS
            and all(v.supports(s) for s in layers)]  # winograd takes 3x3 layers only
    plan = compare_mod.plan(",".join(fp32 + broken_variants), "ece408", None, "10,100")
    policy = timer.TimingPolicy(warmup=1, min_runs=3, max_runs=5, budget_s=0.2)
    result = compare_mod.execute(plan, policy)
    rows = {(r.variant, r.batch, r.layer): r for r in result.rows}
    for name in fp32:
        for batch in (10, 100):
            for layer in ("conv1", "conv2"):
                row = rows[(name, batch, layer)]
                assert row.status == "PASS", (name, batch, layer, row.reason)
                assert row.median_ms > 0 and row.accuracy is not None
    wrong = rows[("test-wrong", 10, "conv1")]
    assert wrong.status == "FAIL" and "random inputs" in wrong.reason
    assert "exceed their bounds" in wrong.reason and wrong.median_ms is None and wrong.gflops is None
    unwritten = rows[("test-unwritten", 10, "conv1")]
    assert unwritten.status == "FAIL" and "not written" in unwritten.reason
    cheat = rows[("test-first-call-only", 100, "conv1")]
    assert cheat.status == "FAIL" and cheat.reason.startswith("after timing:")
    assert "not written" in cheat.reason
    for r in result.rows:
        if r.status != "PASS":
            assert r.median_ms is None and r.pct_floor is None and not r.best
    best = [r for r in result.rows if r.best]
    assert {(r.batch, r.layer, r.epilogue) for r in best} == {
        (r.batch, r.layer, r.epilogue) for r in result.rows if r.valid}


def test_cli_compare_saves_and_rerenders(tmp_path, monkeypatch):
    from click.testing import CliRunner

    monkeypatch.setenv("COLUMNS", "250")
    from convlab.cli import main

    runner = CliRunner()
    out = runner.invoke(main, ["compare", "--kernels", "naive,register-tiled", "--batch", "10",
                               "--budget", "0.2", "--save", str(tmp_path)], terminal_width=250)
    assert out.exit_code == 0, out.output
    record = next(tmp_path.glob("compare-*.json"))
    assert record.with_suffix(".md").exists()
    shown = runner.invoke(main, ["results", "show", str(record)], terminal_width=250)
    assert shown.exit_code == 0
    assert shown.output.strip() in out.output


@pytest.mark.smoke
def test_the_checked_pass_poisons_on_the_pipelines_stream():
    """The end-to-end pass poisons the conv outputs, then runs on the pipeline's non-blocking
    stream. A poison on the default stream waits behind whatever that stream holds (here a
    long spin) and lands after, or in the middle of, the pass: NaN where the pass wrote."""
    import cupy

    from convlab.net.pipeline import Pipeline

    network = lab.build_network(MODELS["ece408"], "tiled", 100)
    x = lab.load_input(MODELS["ece408"], 100)
    pipe = Pipeline(network, pinned=True, graph=True)
    pipe.load(x)
    timer.hold_device(200)  # the default stream is busy for 200 ms
    predictions = lab.checked_pass(network, pipe)
    conv = cupy.asnumpy(network.conv_steps[0].output)  # waits for the default stream too
    assert np.isfinite(conv).all()
    assert (predictions == load_weights("ece408").reference_predictions[:100]).all()


@pytest.mark.smoke
@pytest.mark.parametrize("name,half", [("channels-last-fp16", np.float16),
                                       ("channels-last-bf16", np.uint16)])
def test_16_bit_activations_hand_over_without_changing_a_bit(rng, monkeypatch, name, half):
    """channels-last-fp16 AlexNet: the steps before conv2-conv5 and the FC layers the variant
    runs write fp16 (the LRN + pool steps, conv3-conv5, pool5, fc6, fc7) and those read it as
    it is, no staging; the probabilities are the bits of the same network with every
    activation float32 and converted by the variant. channels-last-bf16 the same in bf16 bits
    (rounded to nearest even on both paths)."""
    import cupy

    weights = load_weights("alexnet")
    x = rng.random((8, *weights.spec.input_shape), dtype=np.float32)
    plan = plan_network(weights.spec, VARIANTS[name], 8)
    handed = net.Network(weights, plan)
    written = {s.label: s.output.dtype for s in handed.steps}
    assert [label for label, dtype in written.items() if dtype == half] == [
        "norm1+pool1", "norm2+pool2", "conv3+relu3", "conv4+relu4", "conv5+relu5", "pool5",
        "fc6+relu6", "fc7+relu7"]
    assert [s.label for s in handed.conv_steps if s.category == "fc"] == [
        "fc6+relu6", "fc7+relu7", "fc8"]
    probabilities = cupy.asnumpy(handed.forward(cupy.asarray(x)))
    assert all(s.staged is s.input for s in handed.conv_steps[1:])
    monkeypatch.setattr(net, "half_next", lambda *args: None)
    staged = net.Network(weights, plan)
    assert all(s.output.dtype == np.float32 for s in staged.steps)
    assert np.array_equal(probabilities, cupy.asnumpy(staged.forward(cupy.asarray(x))))
