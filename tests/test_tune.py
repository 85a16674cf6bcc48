"""The autotuner without a GPU: the layer parser, the on-disk cache (round trip, corruption,
source hashes, concurrent writers), the search loop on a fake variant whose configurations
"time" deterministically, the sweep table at 80 and 200 columns, and the CLI command."""

import io
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from convlab import tuning
from convlab.bench import lab, tune
from convlab.cli import main
from convlab.errors import ConvlabError, KernelCompileError
from convlab.gpu.timer import Timing, TimingPolicy
from convlab.kernels import RELU, Support, Variant
from convlab.kernels.base import Config
from convlab.kernels.cpu import Cpu
from convlab.oracle.verify import Check
from convlab.shapes import ConvShape, parse_layer

SHAPE = ConvShape(16, 32, 13, 13, 48, 3, pad=1, bias=True)
DEVICE = "Fake GPU (CC 9.0)"


@dataclass(frozen=True)
class FakeConfig(Config):
    ms: object  # the time the fake kernel reports, or how it fails


@dataclass(frozen=True)
class ModeConfig(Config):
    mode: str


class FakeTiles(Variant):
    """Configurations {"ms": t} take t ms; "crash" raises, "wrong" fails verification."""

    name = "fake-tiles"
    source = "// fake kernel, version 1"
    epilogues = (RELU,)

    def __init__(self, space=(3.0, 1.0, 2.0, "crash", "wrong", "nvrtc"), chosen=None):
        self.space, self.chosen = space, chosen

    def supports(self, shape):
        return Support(shape.K == 3, "" if shape.K == 3 else "3x3 only")

    config_type = FakeConfig

    def configs(self, shape, epilogue=None):
        return [FakeConfig(v) for v in self.space]

    def configured(self, config):
        return type(self)(self.space, FakeConfig.of(config).ms)


class EditedTiles(FakeTiles):
    source = "// fake kernel, version 2"


class SlowBuild(FakeTiles):
    """compile() takes a second and records (pid, start, end) in $BUILD_LOG/<config>; "nvrtc"
    does not compile."""

    name = "slow-build"

    def compile(self, shape, epilogue=None, kernels=None):
        if self.chosen == "nvrtc":
            raise KernelCompileError(self.name, "fake.cu(1): error: oops", ())
        start = time.time()
        time.sleep(1.0)
        record = [os.getpid(), start, time.time()]
        (Path(os.environ["BUILD_LOG"]) / str(self.chosen)).write_text(json.dumps(record))
        return types.SimpleNamespace(seconds=1.0)


class CpuTiles(Cpu):
    """A CPU variant with a tiling space, for the isolated sweep: "abort" kills its process,
    "refuse" raises in prepare, the others compute the convolution."""

    name = "cpu-tiles"

    def __init__(self, mode=None):
        self.mode = mode

    config_type = ModeConfig

    def configs(self, shape, epilogue=None):
        return [ModeConfig(m) for m in ("first", "abort", "refuse", "last")]

    def configured(self, config):
        return CpuTiles(ModeConfig.of(config).mode)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        if self.mode == "abort":
            os.abort()
        if self.mode == "refuse":
            raise ConvlabError("refused in prepare")
        return super().prepare(shape, weights, epilogue, bias)


def fake_run_layer(shape, variant, policy=None, epilogue=None, seed=None):
    value = variant.chosen
    if value == "sigterm":  # what `timeout` sends, delivered while this candidate runs
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    if value == "crash":
        raise RuntimeError("an illegal memory access was encountered")
    if value == "nvrtc":
        raise KernelCompileError(variant.name, 'fake.cu(7): error: identifier "oops" is undefined\n'
                                               "1 error detected", ("-DX=1",))
    if value == "wrong":
        check = Check(False, 0.5, 9.0, "error 0.5 at y[0,0,0,0] is 9x its bound", exceeded=3)
        return types.SimpleNamespace(timing=Timing([0.5] * 10), check=check, compile_s=0.1)
    check = Check(True, 1e-7, 0.01 * value)
    return types.SimpleNamespace(timing=Timing([value] * 10), check=check, compile_s=0.1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "device_key", lambda: DEVICE)
    monkeypatch.setattr(lab, "run_layer", fake_run_layer)
    return tmp_path / tuning.CACHE_FILE


# --- the parser -------------------------------------------------------------------------------

def test_parse_six_to_nine_integers():
    assert parse_layer("128,256,13,13,384,3") == ConvShape(128, 256, 13, 13, 384, 3)
    assert parse_layer("8,16,9,9,4,3,2") == ConvShape(8, 16, 9, 9, 4, 3, stride=2)
    assert parse_layer("8,16,9,9,4,3,1,1") == ConvShape(8, 16, 9, 9, 4, 3, pad=1)
    assert parse_layer(" 128, 384,13,13,384,3,1,1,2", bias=True) == \
        ConvShape(128, 384, 13, 13, 384, 3, 1, 1, 2, True)


@pytest.mark.parametrize("spec", ["1,2,3", "1,2,3,4,5", "1,2,3,4,5,6,1,1,1,1,1", ""])
def test_parse_refuses_other_forms_naming_the_option(spec):
    syntax = r"--layer takes six to ten fields B,C,H,W,M,K\[,stride,pad,groups,dilation\]"
    with pytest.raises(ConvlabError, match=syntax):
        parse_layer(spec)


@pytest.mark.parametrize("spec, field, form", [
    ("a,b,c,d,e,f", "B", "an integer"), ("1,2,3,4,5,6,,1", "stride", "an integer"),
    ("1,2,9,9,5,3x", "K", "a pair such as 1x7"), ("1,2,9,9,5,1x7x2", "K", "a pair"),
    ("1,2,9,9,5,3,1,1,1,2x2", "dilation", "an integer"), ("1,2,9,9,5,3,1,-1", "pad", "0 or more"),
])
def test_parse_names_the_field_it_refuses(spec, field, form):
    with pytest.raises(ConvlabError, match=rf"--layer '{re.escape(spec)}': {field} .*{form}"):
        parse_layer(spec)


def test_parse_takes_rectangular_filters_padding_and_dilation():
    assert parse_layer("32,768,17,17,192,1x7,1,0x3") == \
        ConvShape(32, 768, 17, 17, 192, 1, pad=0, Kw=7, pad_w=3)
    shape = parse_layer("8,64,28,28,64,3,1,2,1,2", bias=True)
    assert shape == ConvShape(8, 64, 28, 28, 64, 3, 1, 2, 1, True, dilation=2)
    assert (shape.Ho, shape.Wo, shape.reduction) == (28, 28, 64 * 9 + 1)
    assert parse_layer("1,2,9,9,5,3x3,1,1x1") == ConvShape(1, 2, 9, 9, 5, 3, pad=1)


def test_layer_text_of_a_rectangular_dilated_layer_parses_back():
    shape = ConvShape(4, 128, 17, 19, 96, 7, 2, 3, 2, True, Kw=1, pad_w=0, dilation=2)
    assert parse_layer(tuning.layer_text(shape).removesuffix(",bias"), bias=True) == shape
    # a square layer's text (the key of every cache entry and shipped tuning) is as it was
    assert tuning.layer_text(SHAPE) == "16,32,13,13,48,3,1,1,1,bias"


def test_parse_passes_on_shape_errors():
    with pytest.raises(ConvlabError, match="groups must divide"):
        parse_layer("1,6,9,9,4,3,1,1,4")


def test_layer_text_is_the_long_form_of_the_syntax():
    assert parse_layer(tuning.layer_text(SHAPE).removesuffix(",bias"), bias=True) == SHAPE


# --- the cache --------------------------------------------------------------------------------

def test_search_stores_the_best_and_lookup_finds_it(cache):
    steps = []
    result = tune.tune(SHAPE, FakeTiles(), RELU, on_step=lambda *a: steps.append(a),
                       isolate=False)
    assert [c.status for c in result.candidates] == ["PASS", "PASS", "PASS", "FAIL", "FAIL", "FAIL"]
    assert result.best.config == {"ms": 1.0} and result.baseline.config == {"ms": 3.0}
    assert steps[0] == (0, 6, {"ms": 3.0}) and steps[-1] == (6, 6, None) and len(steps) == 7
    assert result.cache_path == str(cache)
    assert tuning.lookup(FakeTiles(), SHAPE, RELU) == {"ms": 1.0}
    entry = next(iter(json.loads(cache.read_text())["entries"].values()))
    assert entry["median_ms"] == 1.0 and entry["tried"] == 6 and entry["passed"] == 3
    assert entry["device"] == DEVICE and entry["shape"] == SHAPE.as_dict()


def test_lookup_of_a_registered_variant(cache):
    from convlab.kernels import get_variant

    variant = get_variant("register-tiled")
    key = tuning.cache_key(DEVICE, variant.name, tuning.source_hash(variant), SHAPE, None)
    tuning.store(key, {"config": {"TH": 4, "MT": 8, "MINB": 0}})
    assert tuning.lookup(variant, SHAPE) == {"TH": 4, "MT": 8, "MINB": 0}


def test_pipelined_takes_its_tuned_tiling_for_that_layer_and_epilogue(cache):
    """On an H100, `convlab tune --kernel pipelined` stored a tiling that `compare` then did
    not use: the variant never read the cache."""
    from convlab.kernels import get_variant
    from convlab.kernels.igemm.cost import ranked
    from convlab.kernels.igemm.mma_sync import FAMILIES
    from convlab.shapes import NCHW

    variant = get_variant("pipelined")
    default = variant.config_for(SHAPE, RELU)
    other = next(c for c in variant.configs(SHAPE, RELU) if c != default).as_dict()
    key = tuning.cache_key(DEVICE, variant.name, tuning.source_hash(variant), SHAPE, RELU)
    tuning.store(key, {"config": other})
    assert variant.config_for(SHAPE, RELU).as_dict() == other
    assert variant.defines(SHAPE, RELU)["BN"] == other["bn"]
    assert variant.config_for(SHAPE, None) == default  # another epilogue, another entry
    # a variant reads only its own entries
    mma_sync_nchw = FAMILIES[NCHW]
    assert get_variant("pipelined-3xtf32").config_for(SHAPE, RELU) == ranked(
        SHAPE, "3xtf32", mma_sync_nchw)[0]
    fixed = variant.configured(default)
    assert fixed.config_for(SHAPE, RELU) == default  # a fixed tiling (what tune times) wins
    tuning.store(key, {"config": {**other, "bm": "huge"}})
    assert variant.config_for(SHAPE, RELU) == default  # an unusable entry is ignored


def test_failures_keep_their_reasons_and_never_stop_the_sweep(cache):
    result = tune.tune(SHAPE, FakeTiles(), RELU, isolate=False)
    reasons = {c.config["ms"]: c.reason for c in result.candidates if not c.passed}
    assert reasons["crash"] == "RuntimeError: an illegal memory access was encountered"
    assert reasons["wrong"].startswith("error 0.5 at y[0,0,0,0]")
    assert reasons["nvrtc"] == 'does not compile: fake.cu(7): error: identifier "oops" is undefined'
    lines = tune.failure_lines(result)
    assert len(lines) == 3 and lines[0].startswith("#4 ms=crash: RuntimeError")


def test_the_key_holds_device_epilogue_shape_and_source(cache, monkeypatch):
    tune.tune(SHAPE, FakeTiles(), RELU, isolate=False)
    assert tuning.lookup(FakeTiles(), SHAPE, None) is None
    assert tuning.lookup(FakeTiles(), SHAPE.with_batch(17), RELU) is None
    assert tuning.lookup(EditedTiles(), SHAPE, RELU) is None  # an edited kernel is tuned afresh
    assert tuning.source_hash(EditedTiles()) != tuning.source_hash(FakeTiles())
    monkeypatch.setattr(tuning, "device_key", lambda: "Other GPU (CC 8.0)")
    assert tuning.lookup(FakeTiles(), SHAPE, RELU) is None
    monkeypatch.setattr(tuning, "device_key", lambda: None)  # no GPU: no entry, no error
    assert tuning.lookup(FakeTiles(), SHAPE, RELU) is None


@pytest.mark.parametrize("content", [b"{not json", b"\x00\xff", b"[1, 2]", b'{"format": 99}',
                                     b'{"format": 1, "entries": [1]}',
                                     b'{"format": 1, "entries": {"k": 5}}'])
def test_a_corrupt_cache_is_ignored_then_rewritten(cache, content):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(content)
    assert tuning.lookup(FakeTiles(), SHAPE, RELU) is None
    tune.tune(SHAPE, FakeTiles(), RELU, isolate=False)
    assert json.loads(cache.read_text())["format"] == tuning.CACHE_FORMAT
    assert tuning.lookup(FakeTiles(), SHAPE, RELU) == {"ms": 1.0}


def test_lookup_without_a_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path / "missing" / "dir"))
    monkeypatch.setattr(tuning, "device_key", lambda: DEVICE)
    assert tuning.lookup(FakeTiles(), SHAPE) is None


def test_lookup_reads_the_file_once_until_it_changes(cache, monkeypatch):
    tune.tune(SHAPE, FakeTiles(), RELU, isolate=False)
    reads = []
    real = tuning.json.loads

    def counting(text, *args, **kwargs):
        reads.append(1)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(tuning, "json", types.SimpleNamespace(loads=counting, dumps=json.dumps))
    for _ in range(100):
        assert tuning.lookup(FakeTiles(), SHAPE, RELU) == {"ms": 1.0}
    assert len(reads) == 1
    tune.tune(SHAPE, FakeTiles((0.5,)), RELU, isolate=False)  # a store replaces the file
    assert tuning.lookup(FakeTiles(), SHAPE, RELU) == {"ms": 0.5}


def _store_many(directory, worker, count):
    import os

    os.environ["CONVLAB_CACHE_DIR"] = directory
    for i in range(count):
        tuning.store(f"worker {worker} key {i}", {"config": {"worker": worker, "i": i}})


def test_concurrent_writers_lose_no_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_store_many, args=(str(tmp_path), w, 25)) for w in range(6)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    entries = json.loads((tmp_path / tuning.CACHE_FILE).read_text())["entries"]
    assert len(entries) == 150
    assert entries["worker 5 key 24"]["config"] == {"worker": 5, "i": 24}
    assert not list(tmp_path.glob("*.tmp"))


def test_isolated_candidates_crash_alone(cache, monkeypatch):
    """Each candidate runs in a child process: one that kills its process is a FAIL row and the
    candidates after it still run (on the CPU here; a GPU fault behaves the same way)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the child imports this module
    policy = TimingPolicy(warmup=1, min_runs=3, max_runs=3)
    result = tune.tune(ConvShape(2, 3, 9, 9, 4, 3, pad=1), CpuTiles(), None, policy)
    assert [c.status for c in result.candidates] == ["PASS", "FAIL", "FAIL", "PASS"]
    assert "the child process died (signal 6)" in result.candidates[1].reason
    assert result.candidates[2].reason == "refused in prepare"
    # the policy reached the child: its 3 runs, then the last one on the input that is checked
    # (whether the third stopped as "converged" or "max-runs" depends on the machine's noise)
    assert result.candidates[0].timing.n == 3 + 1
    assert result.candidates[0].bound_ratio < 1
    assert tuning.lookup(CpuTiles(), ConvShape(2, 3, 9, 9, 4, 3, pad=1)) in ({"mode": "first"},
                                                                         {"mode": "last"})


def test_jobs_compile_the_candidates_at_once_in_children_first(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the child imports this module
    log = tmp_path / "builds"
    log.mkdir()
    monkeypatch.setenv("BUILD_LOG", str(log))
    result = tune.tune(SHAPE, SlowBuild((3.0, 1.0, 2.0, "nvrtc")), RELU, isolate=False, jobs=3)
    builds = {p.name: json.loads(p.read_text()) for p in log.iterdir()}
    assert sorted(builds) == ["1.0", "2.0", "3.0"]
    assert all(pid != os.getpid() for pid, _, _ in builds.values())
    # all three ran at once: each started before any of them ended
    assert max(start for _, start, _ in builds.values()) < min(end for _, _, end in builds.values())
    assert [c.status for c in result.candidates] == ["PASS", "PASS", "PASS", "FAIL"]
    assert [c.compile_s for c in result.candidates[:3]] == [pytest.approx(1.1)] * 3
    assert result.candidates[3].reason.startswith("does not compile")
    assert result.best.config == {"ms": 1.0}


def test_one_job_compiles_nothing_ahead(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("BUILD_LOG", str(tmp_path))
    tune.tune(SHAPE, SlowBuild((1.0,)), RELU, isolate=False, jobs=1)
    assert not list(tmp_path.glob("1.0"))


# --- what tune() refuses --------------------------------------------------------------------

def test_refusals(cache, monkeypatch):
    with pytest.raises(ConvlabError, match="does not support .*3x3 only"):
        tune.tune(ConvShape(1, 4, 9, 9, 4, 5), FakeTiles(), isolate=False)
    with pytest.raises(ConvlabError, match="has no tanh-pool epilogue; leave out --epilogue"):
        tune.tune(SHAPE, FakeTiles(), "tanh-pool", isolate=False)
    with pytest.raises(ConvlabError, match="has no tiling space to search"):
        tune.tune(SHAPE, FakeTiles(()), isolate=False)
    monkeypatch.setattr(tuning, "device_key", lambda: None)
    with pytest.raises(ConvlabError, match="CUDA GPU"):
        tune.tune(SHAPE, FakeTiles(), isolate=False)


def test_nothing_passing_stores_nothing(cache):
    result = tune.tune(SHAPE, FakeTiles(("crash", "wrong")), isolate=False)
    assert result.best is None and result.cache_path is None and not cache.exists()
    assert "nothing was stored" in tune.summary(result)


# --- the table, the summary, the plot -------------------------------------------------------

def _render(table, width):
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


def winograd_like_result():
    shape = ConvShape(128, 256, 13, 13, 384, 3, pad=1, bias=True)
    result = tune.TuneResult("winograd", "fp32", shape, RELU, "NVIDIA H100 80GB HBM3 (CC 9.0)",
                             "0123456789abcdef")
    for i, (chunk, block) in enumerate([(128, 256), (128, 128), (64, 256), (32, 128)]):
        ms = [0.61, 0.58, 0.5432, 0.55][i]
        result.candidates.append(tune.Candidate({"tile": 2, "chunk": chunk, "block": block}, "PASS",
                                                timing=Timing([ms] * 12), bound_ratio=0.031,
                                                max_rel_error=2e-7, compile_s=0.42))
    crash = "RuntimeError: an illegal memory access was encountered"
    result.candidates.append(tune.Candidate({"tile": 2, "chunk": 16, "block": 256}, "FAIL", crash))
    return result


def test_table_fits_80_columns_and_cuts_nothing():
    text = _render(tune.sweep_table(winograd_like_result(), 80), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for word in ("#", "config", "status", "Op Time ms", "x best", "chunk=128", "block=256",
                 "0.5432", "1.12", "FAIL"):
        assert word in text


def test_table_at_200_columns_shows_every_column():
    text = _render(tune.sweep_table(winograd_like_result(), 200), 200)
    for header in ("min ms", "GFLOP/s", "err/bound", "RSE", "runs", "compile s"):
        assert header in text
    assert "tile=2 chunk=64 block=256" in text and "70,4" in text  # 38.3 GFLOP in 0.5432 ms


def test_wide_shows_every_column_at_any_width():
    text = _render(tune.sweep_table(winograd_like_result(), 80, wide=True), 250)
    assert "compile s" in text


def test_summary_names_the_best_and_its_gain_over_the_default():
    result = winograd_like_result()
    result.cache_path = "/tmp/x/tune-cache.json"
    text = tune.summary(result)
    assert text.startswith("best: tile=2 chunk=64 block=256, 0.5432 ms, 1.12x faster than the "
                           "default choice (#1); stored in /tmp/x/tune-cache.json")


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tune.plot_sweep(winograd_like_result(), tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_result_as_json():
    record = json.loads(json.dumps(winograd_like_result().as_dict()))
    assert record["best"] == {"tile": 2, "chunk": 64, "block": 256}
    assert record["candidates"][4]["status"] == "FAIL" and record["best_ms"] == 0.5432


def test_sigterm_ends_the_sweep_with_what_was_timed_and_stores_nothing(cache):
    before = signal.getsignal(signal.SIGTERM)
    result = tune.tune(SHAPE, FakeTiles((3.0, 1.0, "sigterm", 2.0)), RELU, isolate=False)
    assert result.interrupted == "stopped after 2 of 4 candidates" and result.stop_status == 143
    assert [c.median_ms for c in result.candidates] == [3.0, 1.0] and result.best.median_ms == 1.0
    assert result.cache_path is None and not cache.exists()
    assert signal.getsignal(signal.SIGTERM) is before
    assert tune.summary(result).startswith("stopped after 2 of 4 candidates")
    assert "nothing was stored" in tune.summary(result)
    finished = tune.tune(SHAPE, FakeTiles((3.0, 1.0, 2.0)), RELU, isolate=False)
    assert finished.interrupted == "" and finished.cache_path and cache.exists()


# --- the command ----------------------------------------------------------------------------

def test_cli_reports_a_bad_layer_naming_the_option():
    result = CliRunner().invoke(main, ["tune", "--layer", "1,2,3", "--kernel", "register-tiled"])
    assert result.exit_code == 1 and "--layer takes" in result.output
    assert "Traceback" not in result.output


def test_cli_prints_the_sweep(monkeypatch):
    calls = []

    def fake_tune(shape, kernel, epilogue, policy, on_step, jobs):
        calls.append((shape, kernel, epilogue, policy.budget_s, jobs))
        on_step(0, 1, {"tile": 2})
        on_step(1, 1, None)
        return winograd_like_result()

    monkeypatch.setattr(tune, "tune", fake_tune)
    result = CliRunner().invoke(main, ["tune", "--layer", "128,256,13,13,384,3,1,1,1",
                                       "--kernel", "register-tiled", "--bias", "--epilogue",
                                       "relu", "--budget", "0.5", "--jobs", "3"])
    assert result.exit_code == 0, result.output
    assert calls == [(ConvShape(128, 256, 13, 13, 384, 3, pad=1, bias=True), "register-tiled",
                      RELU, 0.5, 3)]
    assert "chunk=64" in result.output and "best: tile=2 chunk=64 block=256" in result.output
    assert "FAIL #5 tile=2 chunk=16 block=256: RuntimeError" in result.output


def test_cli_json_and_exit_status_without_a_passing_config(monkeypatch):
    failed = winograd_like_result()
    failed.candidates = failed.candidates[4:]
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: failed)
    result = CliRunner().invoke(main, ["tune", "--layer", "128,256,13,13,384,3", "--kernel",
                                       "register-tiled", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.output)["best"] is None


def test_cli_exits_as_the_signal_says_on_an_interrupted_sweep(monkeypatch):
    stopped = winograd_like_result()
    stopped.candidates = stopped.candidates[:2]
    stopped.cache_path = None
    stopped.interrupted = "stopped after 2 of 6 candidates"
    stopped.stop_status = 143
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: stopped)
    result = CliRunner().invoke(main, ["tune", "--layer", "128,256,13,13,384,3", "--kernel",
                                       "register-tiled"], env={"COLUMNS": "120"})
    assert result.exit_code == 143
    assert "stopped after 2 of 6 candidates" in result.output and "nothing was stored" in result.output
    as_json = CliRunner().invoke(main, ["tune", "--layer", "128,256,13,13,384,3", "--kernel",
                                        "register-tiled", "--json"])
    assert as_json.exit_code == 143
    assert json.loads(as_json.output)["interrupted"] == "stopped after 2 of 6 candidates"


# --- the shipped tunings ---------------------------------------------------------------------

def shipped_entries() -> dict:
    data = json.loads(tuning.SHIPPED.read_text())
    assert data["format"] == tuning.CACHE_FORMAT
    return data["entries"]


def test_shipped_tunings_match_todays_kernels_and_their_layers():
    """Each shipped entry names a registered variant, is keyed by that variant's current source
    hash and holds a tiling its layer accepts. A kernel edit changes the hash and leaves its
    entries unmatched (a fresh install would run the heuristic's tilings): tune again, or
    where the edit leaves the tilings' meaning alone, re-key with
    `python scripts/rekey_tune_cache.py convlab/assets/tunings.json`."""
    from convlab.kernels import VARIANTS

    entries = shipped_entries()
    assert entries
    stale = []
    for key, entry in entries.items():
        variant = VARIANTS[entry["variant"]]
        shape = ConvShape(**entry["shape"])
        if key != tuning.cache_key(entry["device"], variant.name, tuning.source_hash(variant),
                                   shape, entry["epilogue"]):
            stale.append(key)
        config = variant.config_type.from_dict(entry["config"])
        assert variant.accepts(config, shape, entry["epilogue"]), key
    assert not stale, f"{len(stale)} shipped tunings keyed to an older source, e.g. {stale[0]}"


def test_lookup_falls_back_to_the_shipped_tunings(tmp_path, monkeypatch):
    """A fresh install on a GPU the shipped tunings cover gets their tiling; another GPU gets
    none (the heuristic's); the user's own `convlab tune` result wins over the shipped one."""
    from convlab.kernels import get_variant

    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    entry = next(e for e in shipped_entries().values()
                 if e["variant"] == "wgmma-fp16" and e["shape"]["B"] == 64)  # the ResNet layer
    variant, shape = get_variant("wgmma-fp16"), ConvShape(**entry["shape"])
    monkeypatch.setattr(tuning, "device_key", lambda: entry["device"])
    assert tuning.lookup(variant, shape, entry["epilogue"]) == entry["config"]
    assert variant.config_for(shape, entry["epilogue"]).as_dict() == entry["config"]
    other = next(t for t in variant.configs(shape, entry["epilogue"])
                 if t.as_dict() != entry["config"])
    key = tuning.cache_key(entry["device"], variant.name, tuning.source_hash(variant), shape,
                           entry["epilogue"])
    tuning.store(key, {**entry, "config": other.as_dict()})
    assert variant.config_for(shape, entry["epilogue"]) == other
    monkeypatch.setattr(tuning, "device_key", lambda: "Another GPU (CC 9.0)")
    assert tuning.lookup(variant, shape, entry["epilogue"]) is None


def test_a_change_to_the_activations_module_retires_a_channels_last_tuning(tmp_path, monkeypatch):
    """The channels-last family's gather table and staging live in `channels_last`, apart from
    its class (`pipelined.Pipelined`): an edit there must re-key its tunings as an edit to the
    class's own module does."""
    from convlab.kernels import get_variant

    variant = get_variant("channels-last-fp16")
    before = tuning.source_hash(variant)
    real = tuning._module_file
    edited = tmp_path / "channels_last.py"
    edited.write_text(Path(real(type(variant.activations))).read_text() + "\n# an edit\n")
    monkeypatch.setattr(tuning, "_module_file", lambda cls: (
        str(edited) if cls is type(variant.activations) else real(cls)))
    assert tuning.source_hash(variant) != before
    assert tuning.source_hash(get_variant("register-tiled")) == tuning._hash(
        get_variant("register-tiled").source, (real(type(get_variant("register-tiled"))),))


def test_a_child_process_finds_every_tunable_variant_again():
    """tune's and autotune's children rebuilt a variant as module.class(): a family's members
    share one class and need their Form, so `wgmma-fp16` came back as nothing (TypeError)."""
    from convlab.kernels import VARIANTS

    tunable = {name: v for name, v in VARIANTS.items() if v.tunable_fields()}
    assert {"wgmma-split-bf16", "channels-last-fp16", "pipelined"} <= set(tunable)
    for name, variant in tunable.items():
        spec = json.loads(json.dumps(tune.variant_spec(variant)))
        again = tune.rebuilt_variant(spec)
        assert again.name == name and type(again) is type(variant)
        config = variant.configs(SHAPE, RELU)[0]
        assert (again.configured(config.as_dict()).compile_options(SHAPE, RELU)
                == variant.configured(config).compile_options(SHAPE, RELU))
    # and in a fresh interpreter, as the children find it
    spec = json.dumps(tune.variant_spec(tunable["wgmma-split-bf16"]))
    code = ("import json, sys; from convlab.bench import tune; "
            "print(tune.rebuilt_variant(json.loads(sys.argv[1])).name)")
    found = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True,
                           timeout=120)
    assert found.stdout.strip() == "wgmma-split-bf16", found.stderr


def test_a_child_process_rebuilds_a_variant_writing_fp16_as_it_was():
    """The child rebuilt an fp16 conv's writer (`writing(fp16)`, for an fp16 conv after it) as
    the registered float32 writer: the tuner timed and compiled another kernel than it keeps."""
    from convlab.gpu.elements import FLOAT16
    from convlab.kernels import VARIANTS

    writers = [v for v in VARIANTS.values() if FLOAT16 in v.output_dtypes and v.tunable_fields()]
    assert writers
    for registered in writers:
        variant = registered.writing(FLOAT16)
        again = tune.rebuilt_variant(json.loads(json.dumps(tune.variant_spec(variant))))
        assert again.output_dtype == FLOAT16
        assert again.compile_options(SHAPE, RELU) == variant.compile_options(SHAPE, RELU)
        assert (again.compile_options(SHAPE, RELU)
                != registered.compile_options(SHAPE, RELU))
