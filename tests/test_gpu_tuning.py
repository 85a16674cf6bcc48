"""On the GPU: what `convlab tune` stores is the tiling every tunable variant then uses by
itself (Variant.config_for's one order: fixed fields, else the tuned entry, else the heuristic)."""

import pytest

from convlab import tuning
from convlab.bench import autotune, lab, tune
from convlab.gpu import timer
from convlab.kernels import RELU, get_variant
from convlab.shapes import ConvShape

pytestmark = [pytest.mark.gpu, pytest.mark.smoke]

SHAPE = ConvShape(4, 32, 12, 12, 32, 3, pad=1, bias=True)


@pytest.mark.parametrize("name", ["register-tiled", "pipelined", "winograd"])
def test_the_tuned_config_becomes_the_variant_s_own_choice(tmp_path, monkeypatch, name):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    variant = get_variant(name)
    space = variant.configs(SHAPE, RELU)
    # A short search over the heuristic's choice and two others keeps this a smoke test.
    monkeypatch.setattr(type(variant), "configs", lambda self, shape, epilogue=None: space[:3])
    policy = timer.TimingPolicy(min_runs=3, max_runs=10, budget_s=0.1)
    result = tune.tune(SHAPE, variant, RELU, policy)
    assert result.best is not None, tune.failure_lines(result)
    best = result.best.config
    assert tuning.lookup(variant, SHAPE, RELU) == best
    assert variant.config_for(SHAPE, RELU).as_dict() == best
    assert tuning.lookup(variant, SHAPE, None) is None  # another epilogue, another entry


@pytest.mark.gpu
def test_autotune_on_first_use_runs_the_fastest_of_its_candidates(tmp_path, monkeypatch):
    """A layer nobody tuned, wgmma-fp16 with shipped and cached tunings ignored: autotune
    compiles and times the fitted model's first candidates, stores the fastest and the layer
    runs it, verified."""
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.IGNORE_ENV, "1")
    monkeypatch.setattr(tuning, "_session", {})
    variant = get_variant("wgmma-fp16")
    shape = ConvShape(32, 256, 14, 14, 256, 3, pad=1, bias=True)
    if not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)
    outcomes = []
    autotune.enable(candidates=3, budget_s=120, report=lambda e, o: outcomes.append(o))
    try:
        result = lab.run_layer(shape, variant, epilogue=RELU)
    finally:
        autotune.disable()
    assert result.check.passed and result.choice == tuning.Choice.AUTOTUNED
    best = outcomes[-1].best
    assert best is not None and variant.config_for(shape, RELU).as_dict() == best.config
    print(outcomes[-1].summary())
