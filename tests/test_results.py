"""Comparison records without a GPU: arithmetic, JSON round trip, diffs, rendering, the CLI."""

import json
import os
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from convlab import report
from convlab.bench import compare, results
from convlab.cli import main
from convlab.errors import ConvlabError, DataError
from convlab.gpu import hardware, peaks, roofline, timer
from convlab.kernels import TANH_POOL
from convlab.models import DEFAULT_MODEL, get_model
from convlab.shapes import ConvShape

SHAPE = ConvShape(100, 1, 28, 28, 50, 5)
CEILINGS = peaks.Ceilings("Test GPU", copy_gbps=3000.0, fp32_gflops=50000.0, tf32_gflops=300000.0)
COL = {c.header: i for i, c in enumerate(report.COMPARE_COLUMNS)}  # compare_cells' positions


def row(variant, ms, status="PASS", batch=100, layer="conv", epilogue=None, precision="fp32", reason=""):
    timing = timer.Timing([ms * f for f in (0.99, 1.0, 1.01, 1.0, 1.0)]) if ms else None
    return compare.Row(variant=variant, precision=precision, batch=batch, layer=layer, label=layer,
                       shape=SHAPE, epilogue=epilogue, status=status, reason=reason, timing=timing,
                       max_rel_error=1e-7 if ms else None, accuracy=0.9 if ms else None,
                       predictions_differ=0 if ms else None)


def sample():
    rows = [row("naive", 4.0), row("tiled", 2.0), row("register-tiled", 0.5),
            row("broken", None, "FAIL", reason="max relative error 1 > 1e-05"),
            row("cudnn", 1.0), row("cudnn-tf32", None, "SKIP", precision="tf32", reason="needs PyTorch"),
            row("fused", 0.4, epilogue=TANH_POOL), row("cudnn", 1.6, epilogue=TANH_POOL)]
    compare.finish(rows, CEILINGS)
    kernels = list(dict.fromkeys(r.variant for r in rows))
    return compare.Comparison("ece408-high", [100], kernels, rows, CEILINGS.as_dict(),
                              {"name": "Test GPU", "compute_capability": "9.0", "cuda_runtime": "13.0",
                               "cupy": "14"}, vars(timer.TimingPolicy()))


def test_speedups_floor_and_best():
    rows = {(r.variant, r.epilogue): r for r in sample().rows}
    fast = rows[("register-tiled", None)]
    assert fast.speedup_naive == pytest.approx(8.0) and fast.speedup_cudnn == pytest.approx(2.0)
    floor, bound = CEILINGS.floor_ms(SHAPE)
    assert fast.pct_floor == pytest.approx(100 * floor / 0.5) and fast.floor_bound == bound
    assert fast.best and not rows[("tiled", None)].best
    fused = rows[("fused", TANH_POOL)]
    assert fused.best and fused.speedup_cudnn == pytest.approx(4.0) and fused.speedup_naive is None


def test_a_16_bit_row_computing_in_fp32_counts_16_bit_bytes():
    """depthwise-fp16 issues FP32 FMAs on 16-bit tensors: its copy floor is that of 2-byte
    elements (the class's, as its GB/s), not of the FP32 rate's 4-byte ones, which doubled
    it (2026-11-26: 133-195% of the floor on an H100)."""
    depthwise = ConvShape(64, 128, 56, 56, 128, 3, pad=1, groups=128)
    rows = [compare.Row(variant=name, precision="fp16", batch=64, layer="layer", label="layer",
                        shape=depthwise, epilogue=None, status="PASS", reason="",
                        timing=timer.Timing([0.05] * 5))
            for name in ("depthwise-fp16", "cudnn-fp16")]
    compare.finish(rows, CEILINGS)
    ours, cudnn = rows
    assert ours.floor_basis == cudnn.floor_basis == "copy"
    assert ours.floor_ms == pytest.approx(cudnn.floor_ms)
    assert ours.floor_ms == pytest.approx(roofline.traffic_bytes(depthwise, None, 2) / 3e9)


def test_fail_and_skip_rows_show_no_speed():
    rows = {r.variant: r for r in sample().rows if r.epilogue is None}
    for name in ("broken", "cudnn-tf32"):
        r = rows[name]
        assert r.median_ms is None and r.gflops is None and r.pct_floor is None
        assert r.speedup_cudnn is None and not r.best
        cells = report.compare_cells(r)
        assert cells[4:13] == ["-"] * 9
        assert cells[3] == r.status  # the reason goes below the table


def test_record_round_trip(tmp_path):
    comparison = sample()
    record = results.to_record(comparison, "convlab compare --test")
    assert record["schema_version"] == results.SCHEMA_VERSION
    json_path, md_path = results.save(record, tmp_path, report.compare_markdown(comparison))
    loaded = results.load_record(json_path)
    assert loaded == json.loads(json.dumps(record))
    again = results.from_record(loaded)
    assert [r.as_dict() for r in again.rows] == [r.as_dict() for r in comparison.rows]
    assert "| 100 | register-tiled | fp32 | PASS\\* | **0.5000**" in md_path.read_text()


def test_schema_version_is_checked(tmp_path):
    record = results.to_record(sample())
    record["schema_version"] = 99
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    with pytest.raises(DataError, match="schema version 99"):
        results.load_record(path)
    path.write_text("{not json")
    with pytest.raises(DataError, match="not a readable convlab record"):
        results.load_record(path)
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(DataError, match="no schema_version"):
        results.load_record(path)


def test_diff_flags_changes_beyond_noise_and_missing_rows():
    old = sample()
    new = sample()
    by = {(r.variant, r.epilogue): r for r in new.rows}
    by[("tiled", None)].timing = timer.Timing([3.0] * 5)  # 2.0 -> 3.0 ms: slower
    by[("naive", None)].timing = timer.Timing([4.02] * 5)  # +0.5%: noise
    by[("register-tiled", None)].timing = timer.Timing([0.25] * 5)  # faster
    new.rows = [r for r in new.rows if r.variant != "fused"]
    new.rows.append(row("unrolled", 1.5))
    verdicts = {(d.key[0], d.key[3]): d.verdict for d in results.diff(new, old)}
    assert verdicts[("tiled", None)] == "slower"
    assert verdicts[("naive", None)] == "same"
    assert verdicts[("register-tiled", None)] == "faster"
    assert verdicts[("fused", TANH_POOL)] == "missing"
    assert verdicts[("unrolled", None)] == "new"
    assert verdicts[("broken", None)] == "not comparable"


def test_diff_leaves_out_baseline_rows_this_run_did_not_ask_for():
    old = sample()
    old.rows += [row("tiled", 9.0, batch=10000)]
    old.batches = [100, 10000]
    new = sample()
    new.kernels = ["tiled", "cudnn", "cudnn-tf32"]
    new.rows = [r for r in new.rows if r.variant in new.kernels]
    deltas = results.diff(new, old)
    assert {(d.key[0], d.key[1]) for d in deltas} == {("tiled", 100), ("cudnn", 100),
                                                       ("cudnn-tf32", 100)}
    new.rows = [r for r in new.rows if r.variant != "tiled"]
    assert [d.verdict for d in results.diff(new, old) if d.key[0] == "tiled"] == ["missing"]


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_text("old")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        results.atomic_write(target, "new contents")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_results_show_renders_the_saved_record(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    comparison = sample()
    record = results.to_record(comparison)
    json_path, _ = results.save(record, tmp_path, report.compare_markdown(comparison))
    runner = CliRunner()
    out = runner.invoke(main, ["results", "show", str(json_path)])
    assert out.exit_code == 0
    assert "register-tiled" in out.output and "FAIL broken @ batch 100: max relative error" in out.output
    md = runner.invoke(main, ["results", "show", "--markdown", str(json_path)])
    assert md.output.strip() == report.compare_markdown(comparison).strip()


@pytest.mark.parametrize("width", [80, 200])
def test_results_show_keeps_every_key_cell_whole(tmp_path, width):
    """At 80 columns (a pipe) and 200: variant names, times, speedups and errors whole, reasons
    below the table, so `convlab results show rec.json | grep cudnn` finds the cuDNN rows."""
    comparison = sample()
    json_path, _ = results.save(results.to_record(comparison), tmp_path,
                                report.compare_markdown(comparison))
    out = CliRunner().invoke(main, ["results", "show", str(json_path)], terminal_width=width,
                             env={"COLUMNS": str(width)})
    assert out.exit_code == 0 and "…" not in out.output
    assert all(len(line) <= width for line in out.output.splitlines() if "ceilings" not in line)
    lines = out.output.splitlines()
    titles = [i for i, line in enumerate(lines) if line.strip().startswith("ece408-high: conv")]
    plain = lines[titles[0]:titles[1]]  # the table of the plain conv rows
    for r in comparison.rows:
        if r.epilogue is not None:
            continue
        row = next(line for line in plain
                   if re.match(rf"\s*{r.batch}\s+{re.escape(r.variant)}\s", line))
        cells = report.compare_cells(r)
        for i in (COL["variant"], COL["prec"], COL["check"], COL["ms"], COL["%floor"],
                  COL["x cuDNN"], COL["rel err"]):
            assert cells[i] in row, (cells[i], row)
    grepped = [line for line in lines if "cudnn" in line]
    assert any(re.search(r"cudnn\s+fp32\s+PASS\s+1\.0000", line) for line in grepped)
    assert any(line.startswith("FAIL broken @ batch 100: max relative error") for line in lines)


def test_results_show_missing_file_is_a_clear_error(tmp_path):
    out = CliRunner().invoke(main, ["results", "show", str(tmp_path / "nope.json")])
    assert out.exit_code == 1 and "no such file" in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("args,message", [
    (["--kernels", "nope"], "unknown kernel 'nope'"),
    (["--kernels", ","], "at least one variant"),
    (["--layer", "1,2,3"], "six to ten fields"),
    (["--layer", "a,b,c,d,e,f"], "B (number 1 of"),
    (["--layer", "1,1,3,3,2,5"], "does not fit"),
    (["--layer", "1,4,9,9,6,3,1,1,4,7,1"], "six to ten fields"),
    (["--suite", "resnet"], "no layer suite 'resnet'"),
    (["--suite", "vgg16", "--model", "alexnet"], "leave out --model"),
    (["--classes", "fp16"], "--classes goes with --suite"),
    (["--suite", "vgg16", "--classes", "fp8"], "--classes takes precision classes"),
    (["--suite", "vgg16", "--autotune", "--autotune-budget", "0"], "must be a positive number"),
    (["--layer", "1,4,9,9,6,3,1,1,3"], "3 groups must divide both C=4 and M=6"),
    (["--bias", "--model", "ece408"], "--bias goes with --layer"),
    (["--batch", ""], "at least one batch size"),
    (["--batch", "10,x"], "comma-separated integers"),
    (["--batch", "0"], "between 1 and 10000"),
    (["--model", "lenet"], "unknown model"),
    (["--model", "ece408", "--layer", "1,1,28,28,2,5"], "not both"),
])
def test_compare_argument_errors(args, message):
    out = CliRunner().invoke(main, ["compare", *args])
    assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output


def test_compare_without_gpu_says_so(monkeypatch):
    from convlab import gpu

    monkeypatch.setattr(gpu, "_probe", lambda: (None, "CuPy is not installed (test)"))
    out = CliRunner().invoke(main, ["compare", "--batch", "10"])
    assert out.exit_code == 1 and "needs a CUDA GPU" in out.output


def test_plan_defaults():
    p = compare.plan(None, None, None, "10,100")
    assert p.model == DEFAULT_MODEL and p.batches == [10, 100]
    assert "cudnn" in p.kernels and "cudnn-tf32" in p.kernels and "cpu" not in p.kernels
    assert list(p.shapes_for(10)) == list(get_model(DEFAULT_MODEL).conv_shapes(10))
    with pytest.raises(ConvlabError):
        compare.parse_layer("1,2")
    assert compare.parse_layer("128,96,27,27,256,5,1,2,2", bias=True) == ConvShape(
        128, 96, 27, 27, 256, 5, stride=1, pad=2, groups=2, bias=True)
    assert compare.parse_layer("1,3,227,227,96,11,4") == ConvShape(1, 3, 227, 227, 96, 11, stride=4)


def test_plot_needs_matplotlib_or_writes_png(tmp_path):
    from convlab import plot

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ConvlabError, match="matplotlib"):
            plot.plot_comparison(sample(), tmp_path / "p.png")
        return
    path = plot.plot_comparison(sample(), tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_keeps_the_kernel_files_it_compared():
    c = sample()
    c.kernel_files = [{"path": "mine.cu", "sha256": "ab", "files": []}]
    assert results.from_record(results.to_record(c)).kernel_files == c.kernel_files


def test_speedup_divides_by_the_fastest_cudnn_row_of_the_class_and_names_it():
    """Both layouts of cuDNN compete; the faster (here channels-last) is the basis, a tf32 row
    is never divided by an fp32 cuDNN row, and the table says which layout was the basis."""
    rows = [row("cudnn", 2.0), row("cudnn-nhwc", 0.5), row("register-tiled", 1.0),
            row("cudnn-tf32", 0.4, precision="tf32"), row("cudnn-nhwc-tf32", 0.8, precision="tf32"),
            row("pipelined", 0.2, precision="tf32"), row("pipelined-fp16", 0.1, precision="fp16")]
    compare.finish(rows, CEILINGS)
    by = {r.variant: r for r in rows}
    assert by["register-tiled"].speedup_cudnn == pytest.approx(0.5)
    assert by["register-tiled"].cudnn_basis == "cudnn-nhwc"
    assert by["cudnn"].speedup_cudnn == pytest.approx(0.25)
    assert by["pipelined"].speedup_cudnn == pytest.approx(2.0)
    assert by["pipelined"].cudnn_basis == "cudnn-tf32"
    assert by["pipelined-fp16"].speedup_cudnn is None  # no fp16 cuDNN row: no ratio at all
    assert report.compare_cells(by["register-tiled"])[COL["x cuDNN"]] == "0.50 nhwc"
    assert report.compare_cells(by["pipelined"])[COL["x cuDNN"]] == "2.00 nchw"
    again = compare.Row.from_dict(json.loads(json.dumps(by["register-tiled"].as_dict())))
    assert again.cudnn_basis == "cudnn-nhwc"


def test_a_failed_cudnn_row_is_no_basis():
    rows = [row("cudnn", 2.0), row("cudnn-nhwc", None, "FAIL", reason="wrong"),
            row("tiled", 1.0)]
    compare.finish(rows, CEILINGS)
    assert rows[2].speedup_cudnn == pytest.approx(2.0) and rows[2].cudnn_basis == "cudnn"


def test_a_compared_layer_runs_at_its_own_batch_unless_told():
    """--layer names its batch (B): a 64-image layer is not swept at 10 to 10,000 images, whose
    largest would not fit the device for an ImageNet-sized layer."""
    assert compare.plan("naive", None, "64,3,24,24,8,3,1,1", None).batches == [64]
    assert compare.plan("naive", None, "64,3,24,24,8,3,1,1", "2,4").batches == [2, 4]


def test_compare_plans_cudnn_rows_in_both_layouts():
    p = compare.plan("pipelined-fp16", None, "8,16,12,12,16,3,1,1", "8")
    assert p.kernels == ["pipelined-fp16", "cudnn", "cudnn-nhwc", "cudnn-tf32", "cudnn-nhwc-tf32",
                         "cudnn-fp16", "cudnn-nhwc-fp16"]


def test_header_says_how_rows_were_timed():
    comparison = sample()
    assert "queued behind a spin kernel" in report.compare_header(comparison)
    comparison.policy = {k: v for k, v in comparison.policy.items() if k != "method"}
    assert "one launch on an idle GPU" in report.compare_header(comparison)


def test_rows_timed_by_another_method_are_not_compared():
    """A record from before dispatch-free timing is no baseline for a queued one."""
    old, new = sample(), sample()
    for r in new.rows:
        if r.timing is not None:
            r.timing.method = timer.QUEUED
    verdicts = {d.key[0]: d.verdict for d in results.diff(new, old) if d.key[2] == "conv"
                and d.key[3] is None}
    assert verdicts["tiled"] == "not comparable"
    assert {d.verdict for d in results.diff(new, new)} <= {"same", "not comparable"}


def test_committed_records_fit_80_columns_with_the_cudnn_basis_named():
    """The x cuDNN cell names its basis's layout ("0.51 nhwc"); the key columns must still fit
    80 columns whole, with the longest variant names and batch 10,000. rel err is the first
    column to go where they do not leave it room: the ResNet record of 2026-11-25, with
    channels-last-3xtf32 beside the ms and x cuDNN cells, printed it cut to "3.8e"."""
    from rich.console import Console

    folder = os.path.join(os.path.dirname(__file__), "..", "results", "h100")
    for name, rel_err in (("compare-layer-64x64x56x56x64x3-p1-20261125T032540.json", True),
                          ("compare-ece408-20261125T032951.json", True),
                          ("compare-layer-64x64x56x56x64x3-p1-20261125T214736.json", False)):
        comparison = results.from_record(results.load_record(os.path.join(folder, name)))
        console = Console(width=80, record=True, file=open(os.devnull, "w"))
        for table, notes in report.compare_tables(comparison, 80):
            console.print(table)
            for note in notes:
                console.print(note)
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= 80
        hidden = " ".join(re.findall(r"hidden: (.*?)--wide", text, re.S))
        assert ("rel err" in hidden) != rel_err, name
        for row in comparison.rows:
            if row.valid:
                cells = report.compare_cells(row)
                line = next(ln for ln in text.splitlines()
                            if f" {row.variant} " in f" {ln} " and cells[4] in ln)
                assert cells[COL["x cuDNN"]] in line, line
                assert (cells[COL["rel err"]] in line) == rel_err, line


def interrupting_rows(calls, at):
    """variant_rows for execute: a row per call, and at call `at` what SIGTERM does."""
    import signal

    def rows(variant, batch, model, policy, shapes, weights, verify, epilogues=None,
             shared=None):
        calls.append(variant.name)
        if len(calls) == at:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        return [compare.Row(variant.name, variant.precision, batch, "conv1", "conv1",
                            shapes["conv1"])]
    return rows


def test_sigterm_stops_a_compare_with_the_rows_measured_so_far(monkeypatch):
    import signal

    monkeypatch.setattr(compare, "require_cupy", lambda what: None)
    monkeypatch.setattr(peaks, "ceilings", lambda: peaks.Ceilings("test", 1000.0, 1e4, 4e4))
    monkeypatch.setattr(hardware, "device_info", lambda: {"name": "test"})
    calls = []
    monkeypatch.setattr(compare, "variant_rows", interrupting_rows(calls, at=2))
    before = signal.getsignal(signal.SIGTERM)
    p = compare.plan("naive,tiled,constant", "ece408", None, "10,100")
    result = compare.execute(p, timer.TimingPolicy())
    assert calls == ["naive", "tiled"] and [r.variant for r in result.rows] == ["naive"]
    runs = 2 * len(p.kernels)  # the cuDNN rows compare adds run too
    assert result.interrupted == f"stopped after 1 of {runs} variant runs"
    assert result.stop_status == 143  # 128 + SIGTERM, as the shell reports a killed command
    assert signal.getsignal(signal.SIGTERM) is before
    calls.clear()
    monkeypatch.setattr(compare, "variant_rows", interrupting_rows(calls, at=0))
    finished = compare.execute(p, timer.TimingPolicy())
    assert len(calls) == runs and len(finished.rows) == runs and finished.interrupted == ""


def test_an_interrupted_compare_prints_what_it_has_and_keeps_it_where_asked(monkeypatch,
                                                                           tmp_path):
    shape = get_model("ece408").conv_shapes(10)["conv1"]
    partial = compare.Comparison("ece408", [10], ["naive", "tiled"],
                                 [compare.Row("naive", "fp32", 10, "conv1", "conv1", shape)],
                                 device={"name": "test"}, policy={},
                                 interrupted="stopped after 1 of 2 variant runs",
                                 stop_status=130)
    monkeypatch.setattr(compare, "execute", lambda plan, policy, progress: partial)
    out = CliRunner().invoke(main, ["compare", "--kernels", "naive,tiled", "--model", "ece408",
                                    "--batch", "10", "--save", str(tmp_path / "records")])
    assert out.exit_code == 130
    assert "naive" in out.output and "stopped after 1 of 2 variant runs" in out.output
    saved = sorted((tmp_path / "records").iterdir())
    assert [p.suffix for p in saved] == [".json", ".md"]
    assert all(p.stem.endswith("-interrupted") for p in saved)
    record = results.load_record(saved[0])
    assert record["interrupted"] == "stopped after 1 of 2 variant runs"
    assert results.from_record(record).interrupted == record["interrupted"]
    assert "**Interrupted: stopped after 1 of 2" in saved[1].read_text()
    shown = CliRunner().invoke(main, ["results", "show", str(saved[0])])
    assert shown.exit_code == 0 and "Interrupted: stopped after 1 of 2" in shown.output
    unsaved = CliRunner().invoke(main, ["compare", "--kernels", "naive,tiled", "--model",
                                        "ece408", "--batch", "10"])
    assert unsaved.exit_code == 130 and "nothing was saved" in unsaved.output
    as_json = CliRunner().invoke(main, ["compare", "--kernels", "naive,tiled", "--model",
                                        "ece408", "--batch", "10", "--json"])
    assert as_json.exit_code == 130
    assert json.loads(as_json.stdout)["interrupted"] == "stopped after 1 of 2 variant runs"


def test_all_says_which_variants_another_gpu_runs(monkeypatch):
    from convlab.kernels import base

    monkeypatch.setattr(base, "compute_capability", lambda: (8, 0))
    p = compare.plan("all", "alexnet", None, "128")
    hopper = ["wgmma", "wgmma-3xtf32", "wgmma-split-bf16", "wgmma-fp16", "wgmma-bf16"]
    assert list(p.other_gpus) == hopper and not set(hopper) & set(p.kernels)
    assert "this GPU is 8.0" in p.other_gpus["wgmma"]
    assert compare.plan("naive,wgmma", "alexnet", None, "128").other_gpus == {}
    line = report.other_gpus_line(p.other_gpus)
    assert line.startswith("Not run on this GPU: wgmma, wgmma-3xtf32, wgmma-split-bf16, "
                           "wgmma-fp16, wgmma-bf16: each runs on compute capability 9.0")
    assert line.count("9.0") == 1
    monkeypatch.setattr(base, "compute_capability", lambda: (9, 0))
    assert compare.plan("all", "alexnet", None, "128").other_gpus == {}


def test_a_saved_record_keeps_the_variants_left_for_another_gpu(tmp_path):
    reasons = {"wgmma": "'wgmma' runs on compute capability 9.0 GPUs (sm_90a instructions); "
                        "this GPU is 8.0"}
    comparison = sample()
    comparison.other_gpus = reasons
    record = json.loads(json.dumps(results.to_record(comparison)))
    assert results.from_record(record).other_gpus == reasons
    assert "Not run on this GPU: wgmma: runs on" in report.compare_markdown(comparison)
    assert "other_gpus" not in results.to_record(sample())


def test_compare_prints_the_variants_left_for_another_gpu(monkeypatch):
    shape = get_model("ece408").conv_shapes(10)["conv1"]
    done = compare.Comparison("ece408", [10], ["naive"],
                              [compare.Row("naive", "fp32", 10, "conv1", "conv1", shape)],
                              device={"name": "test"}, policy={},
                              other_gpus={"wgmma": "'wgmma' runs on compute capability 9.0 GPUs "
                                                   "(sm_90a instructions); this GPU is 8.0"})
    monkeypatch.setattr(compare, "execute", lambda plan, policy, progress: done)
    out = CliRunner().invoke(main, ["compare", "--model", "ece408", "--batch", "10"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "Not run on this GPU: wgmma: runs on compute capability 9.0 GPUs" in out.output


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_says_dirty_where_the_package_differs_from_head(tmp_path):
    """A record names HEAD, and says "-dirty" where the package's tracked files were changed
    after it (changes elsewhere in the checkout do not count)."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("n\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = results.git_commit(package)
    assert head and "-" not in head
    (tmp_path / "notes.md").write_text("changed\n")
    assert results.git_commit(package) == head
    (package / "a.py").write_text("x = 2\n")
    assert results.git_commit(package) == head + "-dirty"
