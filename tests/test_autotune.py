"""Where a layer's tiling comes from (own, shipped, cached, autotuned), the switch that
ignores shipped and cached tunings, and autotune on first use: candidates timed in a child
process, the fastest kept in the cache and in this process, nothing stored when it fails or
is interrupted."""

import json
from pathlib import Path

import pytest
from test_tune import DEVICE, SHAPE, CpuTiles, FakeTiles, ModeConfig

from convlab import tuning
from convlab.bench import autotune, lab
from convlab.bench.records import LayerResult
from convlab.errors import ConvlabError
from convlab.kernels import RELU, base, get_variant
from convlab.kernels.igemm import learned
from convlab.shapes import ConvShape

SMALL = ConvShape(2, 3, 9, 9, 4, 3, pad=1)


class CpuModes(CpuTiles):
    """Three candidates the timing child can run: two compute, "refuse" fails alone."""

    name = "cpu-modes"

    def configs(self, shape, epilogue=None):
        return [ModeConfig(m) for m in ("first", "refuse", "last")]

    def configured(self, config):
        return CpuModes(ModeConfig.of(config).mode)

    def default_config(self, shape, epilogue=None):
        return ModeConfig("first")

    def accepts(self, config, shape, epilogue=None):
        return True


@pytest.fixture
def gpu_named(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(tuning.IGNORE_ENV, raising=False)
    monkeypatch.setattr(tuning, "device_key", lambda: DEVICE)
    monkeypatch.setattr(tuning, "_session", {})
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the child imports this module
    yield
    tuning.set_autotuner(None)


def store(variant, shape, config, by=tuning.BY_TUNE, path=None):
    key = tuning.cache_key(DEVICE, variant.name, tuning.source_hash(variant), shape, RELU)
    tuning.store(key, {"variant": variant.name, "config": config, "by": by}, path)


def test_each_origin_of_a_tiling_is_named(gpu_named, monkeypatch, tmp_path):
    variant = get_variant("wgmma-fp16")
    shape = ConvShape(128, 256, 14, 14, 256, 3, pad=1, bias=True)
    own = variant.config_for(shape, RELU)
    assert variant.choice_for(shape, RELU) == tuning.Choice.OWN
    assert FakeTiles().resolve(SHAPE, RELU) == (None, "")  # no tiling of its own: none at all
    shipped = tmp_path / "shipped.json"
    others = [t.as_dict() for t in variant.configs(shape, RELU) if t != own]
    store(variant, shape, others[0], path=shipped)
    monkeypatch.setattr(tuning, "SHIPPED", shipped)
    assert variant.resolve(shape, RELU) == (variant.config_type.of(others[0]),
                                            tuning.Choice.SHIPPED)
    store(variant, shape, others[1])
    assert variant.choice_for(shape, RELU) == tuning.Choice.CACHED
    store(variant, shape, others[2], by=tuning.BY_AUTOTUNE)
    assert variant.resolve(shape, RELU) == (variant.config_type.of(others[2]),
                                            tuning.Choice.AUTOTUNED)
    assert variant.configured(own).choice_for(shape, RELU) == ""  # its tiling fixed whole


def test_ignoring_tunings_leaves_the_own_choice_and_this_runs_autotune(gpu_named, monkeypatch):
    variant = get_variant("wgmma-fp16")
    shape = ConvShape(128, 256, 14, 14, 256, 3, pad=1, bias=True)
    own = variant.config_for(shape, RELU)
    other = next(t for t in variant.configs(shape, RELU) if t != own)
    store(variant, shape, other.as_dict())
    assert variant.config_for(shape, RELU) == other
    monkeypatch.setenv(tuning.IGNORE_ENV, "1")
    assert variant.resolve(shape, RELU) == (own, tuning.Choice.OWN)
    key = tuning.cache_key(DEVICE, variant.name, tuning.source_hash(variant), shape, RELU)
    tuning.remember(key, other.as_dict())
    assert variant.resolve(shape, RELU) == (other, tuning.Choice.AUTOTUNED)
    monkeypatch.setenv(tuning.IGNORE_ENV, "0")
    assert variant.choice_for(shape, RELU) == tuning.Choice.AUTOTUNED


def test_first_use_autotunes_only_an_open_tiling_without_an_entry(gpu_named):
    calls = []
    tuning.set_autotuner(lambda v, s, e: calls.append((v.name, s, e)))
    tuning.first_use(FakeTiles(), SHAPE, RELU)
    wgmma = get_variant("wgmma-fp16")
    tuning.first_use(wgmma.configured(wgmma.configs(SHAPE)[0]), SHAPE, RELU)  # fixed whole
    tuning.first_use(CpuModes(), SHAPE, None)
    store(FakeTiles(), SHAPE, {"ms": 1.0})
    tuning.first_use(FakeTiles(), SHAPE, RELU)  # tuned already
    assert calls == [("fake-tiles", SHAPE, RELU), ("cpu-modes", SHAPE, None)]
    tuning.set_autotuner(None)
    tuning.first_use(CpuModes(), SMALL, None)
    assert len(calls) == 2


def test_autotune_times_the_candidates_and_keeps_the_fastest(gpu_named, tmp_path):
    events = []
    tuner = autotune.Autotuner(candidates=3, budget_s=60, jobs=1,
                               report=lambda event, outcome: events.append(event))
    outcome = tuner(CpuModes(), SMALL, None)
    assert events == ["start", "compiled", "done"], outcome.summary()
    assert [t.config["mode"] for t in outcome.tried] == ["first", "refuse", "last"], outcome.summary()
    assert outcome.tried[1].reason == "refused in prepare" and not outcome.tried[1].passed
    best = outcome.best
    assert best.config["mode"] in ("first", "last") and best.passed
    entries = json.loads(tuning.cache_path().read_text())["entries"]
    (entry,) = entries.values()
    assert entry["by"] == tuning.BY_AUTOTUNE and entry["config"] == best.config
    assert entry["tried"] == 3 and entry["passed"] == 2
    assert CpuModes().choice_for(SMALL, None) == tuning.Choice.AUTOTUNED
    assert outcome.summary().startswith("autotune cpu-modes on 3x9x9->4x9x9 3x3 p1 batch 2: mode=")
    assert "(3 timed," in outcome.summary()


def test_the_budget_stops_timing_after_the_own_choice(gpu_named):
    outcome = autotune.Autotuner(candidates=3, budget_s=1e-6, jobs=1)(CpuModes(), SMALL, None)
    assert [t.config["mode"] for t in outcome.tried] == ["first"]
    assert "(1 of 3 timed," in outcome.summary()


def test_nothing_is_stored_when_no_candidate_passes(gpu_named, monkeypatch):
    monkeypatch.setattr(autotune, "run_isolated",
                        lambda *a, **k: {"status": "crash", "reason": "the process died"})
    outcome = autotune.Autotuner(candidates=2, jobs=1)(CpuModes(), SMALL, None)
    assert outcome.best is None and not tuning.cache_path().exists()
    assert outcome.summary().endswith("the timing process ended: the process died; it runs "
                                      "its own choice")


def test_an_interrupted_autotune_leaves_the_cache_as_it_was(gpu_named, monkeypatch):
    store(FakeTiles(), SHAPE, {"ms": 1.0})
    before = tuning.cache_path().read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(autotune, "run_isolated", interrupted)
    with pytest.raises(KeyboardInterrupt):
        autotune.Autotuner(candidates=2, jobs=1)(CpuModes(), SMALL, None)
    assert tuning.cache_path().read_bytes() == before and not tuning._session


@pytest.mark.parametrize("kwargs, message", [
    ({"budget_s": 0}, "budget must be a positive number of seconds, not 0"),
    ({"candidates": 0}, "at least one candidate"),
])
def test_autotune_refuses_a_budget_or_count_it_cannot_use(kwargs, message):
    with pytest.raises(ConvlabError, match=message):
        autotune.Autotuner(**kwargs)


def test_the_lab_autotunes_a_layer_before_it_prepares_it(gpu_named):
    autotune.enable(candidates=2, budget_s=60, jobs=1)
    result = lab.run_layer(SMALL, CpuModes(), seed=1)
    assert result.choice == tuning.Choice.AUTOTUNED
    # the record names the tiling that ran, not only where it came from
    assert result.config == CpuModes().config_for(SMALL, None).as_dict()
    assert LayerResult.from_dict(result.as_dict()).config == result.config
    autotune.disable()
    assert not tuning.autotuning()


def test_the_wgmma_choice_is_the_fitted_order_of_the_tuners_list():
    variant = get_variant("wgmma-fp16")
    shape = ConvShape(128, 1024, 14, 14, 256, 1, bias=True)  # ResNet's layer3 1x1, batch 128
    offered = variant.configs(shape, RELU)
    assert variant.default_config(shape, RELU) == offered[0]
    assert offered[0].schedule != "halo"  # the analytic model alone chose halo on such layers
    assert learned.coefficients() is not None
    k = variant.kernel_shape(shape)
    fitted = [t for t in offered if t.schedule != "pingpong"]  # outside the fit's data
    scores = [learned.score(k, t, "fp16", variant.tiling_estimate(shape, t)) for t in fitted]
    assert scores == sorted(scores)
    # the rule's twin first, or the tuner's twin last
    assert [i for i, t in enumerate(offered) if t.schedule == "pingpong"] in ([], [0],
                                                                               [len(offered) - 1])


def test_the_shipped_tiling_model_is_what_the_fit_makes_of_the_committed_sweeps(tmp_path, script):
    """scripts/fit_tiling_model.py on the committed sweeps (results/h100/tiling-sweep-20261127,
    and tiling-sweep-splitk-20261127 of the cells whose candidates split K) gives the shipped
    weights, and with each network's cells left out of the fit its choice is within 1.10x of
    the cell's fastest tiling on at least 78% of the cells (the choices the sweeps ran: 67%)."""
    fit = script("fit_tiling_model")
    model, held_out = fit.main(["", str(tmp_path / "model.json")])
    shipped = json.loads(learned.MODEL_FILE.read_text())
    assert shipped["features"] == list(learned.FEATURES)
    for name, weight in shipped["weights"].items():
        assert model["weights"][name] == pytest.approx(weight, rel=1e-6, abs=1e-9)
    assert sum(r <= 1.10 for r in held_out) >= 0.78 * len(held_out)


def test_a_split_cells_sweep_takes_the_layers_whose_tilings_split_k(monkeypatch, script):
    """`sweep_tilings.py --split-cells`: a variant's cell only where one of its candidates
    splits K, and with --cudnn the cuDNN rows of those layers only (before the review they
    came for every layer of the suite)."""
    monkeypatch.setattr(base, "compute_capability", lambda: None)  # as on a Hopper GPU
    sweep = script("sweep_tilings")
    split = sweep.tasks("resnet50", 0, ["wgmma"], True, split_cells=True)
    every = sweep.tasks("resnet50", 0, ["wgmma"], False)
    mine = {t["label"] for t in split if t["variant"] == "wgmma"}
    assert mine and {t["label"] for t in split if t["variant"] == "cudnn"} == mine
    variant = get_variant("wgmma")
    for task in every:
        splits = any(t.split_k > 1 for t in variant.ranked(ConvShape(**task["shape"])))
        assert splits == (task["label"] in mine), task["label"]
    assert len(mine) < len(every)
