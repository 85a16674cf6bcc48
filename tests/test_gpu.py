"""GPU checks: every variant against float64 on fresh random inputs, and in the real network.

Run on a GPU machine with `pytest -m gpu`; without CuPy or a GPU these tests skip.
"""

import numpy as np
import pytest

from convlab import lab, measure
from convlab.kernels import TANH_POOL, VARIANTS
from convlab.models import MODELS, load_weights
from convlab.shapes import ConvShape
from convlab.verify import compare, poison, random_problem, reference_output

pytestmark = pytest.mark.gpu

GPU_VARIANTS = [v for v in VARIANTS.values() if v.on_gpu]

SHAPES = [
    ConvShape(1, 1, 28, 28, 50, 5),      # B=1, C=1: the Fall 2017 layer
    ConvShape(7, 1, 48, 48, 12, 7),      # Spring 2018 conv1
    ConvShape(3, 12, 21, 21, 24, 7),     # Spring 2018 conv2, C > 1
    ConvShape(5, 3, 17, 13, 10, 3),      # odd H and W, H != W, K=3, M=10
    ConvShape(33, 4, 11, 19, 7, 5),      # B=33, M=7 (no multiple of any tile)
    ConvShape(2, 2, 9, 30, 65, 3),       # M=65: more than one channel block everywhere
    ConvShape(131, 1, 28, 28, 50, 5),    # B=131: the last block is partial
    ConvShape(4, 16, 14, 14, 33, 5),     # C=16, M=33
    ConvShape(2, 5, 10, 8, 12, 1),       # K=1
    ConvShape(3, 1, 5, 5, 3, 5),         # a 1x1 output
]


def run_variant(variant, shape, x, w, epilogue=None):
    import cupy

    op = variant.prepare(shape, w, epilogue)
    xd = cupy.asarray(x)
    y = cupy.empty(op.output_shape, dtype=cupy.float32)
    poison(y)
    op(xd, y)
    return cupy.asnumpy(op.output(y))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_variant_matches_float64_reference(variant, shape, rng):
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    x, w = random_problem(shape, rng)
    got = run_variant(variant, shape, x, w)
    check = compare(got, reference_output(x, w, shape, None), variant.precision)
    assert check.passed, check.reason


EPILOGUE_SHAPES = [ConvShape(3, 1, 28, 28, 50, 5), ConvShape(5, 1, 48, 48, 12, 7),
                   ConvShape(4, 3, 12, 11, 7, 3), ConvShape(33, 2, 10, 9, 13, 4),
                   ConvShape(1, 1, 6, 7, 1, 5)]


@pytest.mark.parametrize("shape", EPILOGUE_SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", [v for v in GPU_VARIANTS if TANH_POOL in v.epilogues],
                         ids=lambda v: v.name)
def test_tanh_pool_epilogue_matches_reference(variant, shape, rng):
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    x, w = random_problem(shape, rng)
    got = run_variant(variant, shape, x, w, TANH_POOL)
    check = compare(got, reference_output(x, w, shape, TANH_POOL), variant.precision)
    assert check.passed, check.reason


@pytest.mark.parametrize("name", ["constant", "unrolled"])
def test_constant_memory_ops_of_one_shape_keep_their_own_weights(name, rng):
    """Two models with the same conv shape share one compiled module (and constant bank)."""
    import cupy

    variant = VARIANTS[name]
    shape = ConvShape(4, 1, 28, 28, 50, 5)
    x, w1 = random_problem(shape, rng)
    _, w2 = random_problem(shape, rng)
    op1, op2 = variant.prepare(shape, w1), variant.prepare(shape, w2)
    xd = cupy.asarray(x)
    y = cupy.empty(shape.output_shape, dtype=cupy.float32)
    for op, w in ((op1, w1), (op2, w2), (op1, w1)):
        poison(y)
        op(xd, y)
        assert compare(cupy.asnumpy(y), reference_output(x, w, shape, None), "fp32").passed


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=lambda v: v.name)
def test_network_reproduces_cpu_accuracy(variant, model):
    spec_shapes = MODELS[model].conv_shapes(10000).values()
    if not all(variant.supports(s) for s in spec_shapes):
        pytest.skip("variant does not support this model's layers")
    policy = measure.TimingPolicy(warmup=1, min_runs=2, max_runs=3)
    result = lab.run(model, variant.name, 10000, policy)
    failures = [f"{layer.label}: {layer.check.reason}" for layer in result.layers if not layer.check.passed]
    assert not failures, failures
    expected = load_weights(model).expected_accuracy[10000]
    if variant.precision == "fp32":
        assert result.predictions_differ == 0
        assert result.accuracy == expected
    else:
        # Reduced precision may flip near-ties; the count is reported, and must stay small.
        assert result.predictions_differ <= 100, result.predictions_differ


def test_timing_uses_events_and_stops(rng):
    import cupy

    a = cupy.asarray(rng.random((2048, 2048), dtype=np.float32))
    timing = measure.time_device(lambda: a @ a, measure.TimingPolicy(min_runs=5, budget_s=1))
    assert timing.n >= 5 and timing.median_ms > 0 and timing.stop in ("converged", "budget", "max-runs")
    cold = measure.time_device(lambda: a @ a, measure.TimingPolicy(min_runs=3, cold=True, budget_s=1))
    assert cold.cold and cold.n >= 3


def test_device_info_and_ceilings(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    info = measure.device_info()
    assert info["name"] and info["compute_capability"]
    first = measure.ceilings()
    assert first.copy_gbps > 100 and first.fp32_gflops > 1000 and first.tf32_gflops > first.fp32_gflops
    assert measure.ceilings() == first  # cached on disk
    assert list(tmp_path.glob("ceilings-*.json"))


# --- convlab compare on the GPU, with deliberately broken test-only variants ----------------

from convlab import compare as compare_mod  # noqa: E402
from convlab.kernels.base import Op  # noqa: E402
from convlab.kernels.naive import Naive  # noqa: E402


class SkipsLastTap(Naive):
    name = "test-wrong"
    source = Naive.source.replace("q < K; ++q", "q < K - 1; ++q")


class SkipsLastColumn(Naive):
    name = "test-unwritten"
    source = Naive.source.replace("    y[i] = acc;", "    if (w != Wo - 1) y[i] = acc;")


class FirstCallOnly(Naive):
    """Computes on its first call and does nothing afterwards: a cheat of the timer."""

    name = "test-first-call-only"

    def prepare(self, shape, weights, epilogue=None):
        real = super().prepare(shape, weights, epilogue)
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
    fp32 = [v.name for v in GPU_VARIANTS if v.precision == "fp32" and not v.name.startswith("cudnn")]
    plan = compare_mod.plan(",".join(fp32 + broken_variants), "ece408", None, "10,100")
    policy = measure.TimingPolicy(warmup=1, min_runs=3, max_runs=5, budget_s=0.2)
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
    assert "max relative error" in wrong.reason and wrong.median_ms is None and wrong.gflops is None
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
