"""The public layer suites, a suite's comparison plan and its summary per precision class."""

import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from convlab import plot, report
from convlab.bench import compare, results as results_io, suites
from convlab.cli import main
from convlab.errors import ConvlabError
from convlab.gpu import hardware, peaks
from convlab.gpu.timer import Timing, TimingPolicy
from convlab.kernels import REFERENCE_VARIANTS, RELU, get_variant
from convlab.shapes import ConvShape


def test_the_suites_hold_the_networks_distinct_layers():
    every = suites.get_suite("all")
    assert len(every) >= 40 and len({layer.label for layer in every}) == len(every)
    counts = {name: len(suites.get_suite(name)) for name in suites.NETWORKS}
    assert counts == {"resnet50": 23, "vgg16": 9, "mobilenetv2": 29, "unet": 10,
                      "inceptionv3": 11, "alexnet": 5}
    for layer in every:
        assert layer.shape.B == 1 and layer.shape.bias
        assert layer.batches == ((1, 32, 128, 256) if layer.network == "resnet50" else (1, 128))
    resnet = {layer.name: layer for layer in suites.get_suite("resnet50")}
    stage4 = resnet["layer4.0.conv2"].shape
    assert (stage4.C, stage4.H, stage4.M, stage4.Ho, stage4.stride) == (512, 14, 512, 7, 2)
    assert resnet["layer4.0.conv3"].epilogue is None and resnet["layer4.1.conv1"].epilogue == RELU
    kinds = {layer.shape.kernel_text() for layer in suites.get_suite("inceptionv3")}
    assert kinds == {"5x5", "1x7", "7x1"}
    depthwise = [layer for layer in suites.get_suite("mobilenetv2")
                 if suites.is_depthwise(layer.shape)]
    assert len(depthwise) == 10
    assert len(suites.cells("all")) == 23 * 4 + (87 - 23) * 2


def test_suite_names_and_classes_are_checked():
    with pytest.raises(ConvlabError, match="no layer suite 'resnet'; suites: resnet50, vgg16"):
        suites.get_suite("resnet")
    assert suites.parse_classes(None) == ["fp32", "tf32", "fp16", "bf16"]
    assert suites.parse_classes("fp16, TF32") == ["tf32", "fp16"]
    with pytest.raises(ConvlabError, match="--classes takes precision classes"):
        suites.parse_classes("fp8")


def test_a_suite_plan_times_each_family_on_its_layers(monkeypatch):
    plan = compare.suite_plan("mobilenetv2", None, "1", "fp16,tf32")
    assert plan.kernels == ["wgmma", "depthwise", "wgmma-fp16", "depthwise-fp16", "cudnn-tf32",
                            "cudnn-nhwc-tf32", "cublas-gemm-tf32", "cudnn-fp16",
                            "cudnn-nhwc-fp16", "cublas-gemm-fp16"]
    assert plan.batches == [1] and plan.classes == ["tf32", "fp16"]
    shapes = plan.shapes_for(1)
    depthwise = [s for s in shapes.values() if suites.is_depthwise(s)]
    assert depthwise and all(suites.meant_for("depthwise-fp16", s) for s in depthwise)
    assert not any(suites.meant_for("wgmma-fp16", s) for s in depthwise)
    named = compare.suite_plan("alexnet", "wgmma-fp16", None, None)
    assert named.kernels == ["wgmma-fp16", "cudnn-fp16", "cudnn-nhwc-fp16", "cublas-gemm-fp16"]
    assert named.classes == ["fp16"] and named.batches == [1, 128]
    assert named.epilogues["alexnet conv3"] == RELU


def test_cublas_gemm_rows_apply_to_1x1_stride_1_layers_only():
    """cuBLAS's GEMM is a reference row where the layer is one matrix product over its
    channels-last input, and no row at all elsewhere (not a SKIP row per 3x3 layer)."""
    plan = compare.suite_plan("resnet50", "wgmma-fp16", "128", None)
    shapes = plan.shapes_for(128)
    pointwise = shapes["resnet50 layer1.0.conv1"]
    assert compare.applies("cublas-gemm-fp16", pointwise, plan)
    for label in ("resnet50 layer1.0.conv2", "resnet50 layer2.0.downsample", "resnet50 conv1"):
        assert not compare.applies("cublas-gemm-fp16", shapes[label], plan)
        assert compare.applies("cudnn-nhwc-fp16", shapes[label], plan)
    reason = get_variant("cublas-gemm").supports(ConvShape(2, 8, 9, 9, 8, 1, stride=2)).reason
    assert "1x1 layers with stride 1" in reason
    three = [ConvShape(2, 8, 9, 9, 8, 3, pad=1)]
    assert not any(n.startswith("cublas") for n in compare.parse_kernels("wgmma", three))
    one = [ConvShape(2, 8, 9, 9, 8, 1)]
    assert {"cublas-gemm", "cublas-gemm-tf32"} <= set(compare.parse_kernels("wgmma", one))


def test_a_gemm_row_is_a_speedups_basis_where_it_is_fastest():
    rows = [row("wgmma-fp16", "fp16", "a", 1.0, "own"), row("cudnn-nhwc-fp16", "fp16", "a", 2.0),
            row("cublas-gemm-fp16", "fp16", "a", 1.25)]
    compare.finish(rows, None)
    assert rows[0].speedup_cudnn == pytest.approx(1.25)
    assert rows[0].cudnn_basis == "cublas-gemm-fp16"
    assert report.cudnn_ratio(rows[0]) == "1.25 gemm"
    (fp16,) = compare.class_summaries(
        compare.Comparison(None, [128], [], rows, suite="test", classes=["fp16"]))
    assert fp16.ratios == [("a", 128, 1.25, "own")]


def row(variant, precision, layer, ms, choice="", batch=128, status="PASS"):
    shape = ConvShape(batch, 64, 14, 14, 64, 3, pad=1, bias=True)
    return compare.Row(variant, precision, batch, layer, layer, shape, RELU, status=status,
                       timing=Timing([ms] * 5), choice=choice)


def suite_comparison():
    rows = [
        row("wgmma-fp16", "fp16", "a", 1.0, "own"), row("cudnn-fp16", "fp16", "a", 1.5),
        row("cudnn-nhwc-fp16", "fp16", "a", 1.2),
        row("wgmma-fp16", "fp16", "b", 2.0, "autotuned"), row("cudnn-nhwc-fp16", "fp16", "b", 1.0),
        row("wgmma", "tf32", "a", 3.0, "own"), row("depthwise", "fp32", "a", 2.0, ""),
        row("cudnn-tf32", "tf32", "a", 4.0),
        row("wgmma", "tf32", "b", 1.0, "own", status="FAIL"), row("cudnn-tf32", "tf32", "b", 1.0),
    ]
    return compare.Comparison(None, [128], [], rows, suite="test", classes=["tf32", "fp16"])


def test_a_class_summary_counts_cells_against_cudnns_fastest_row():
    tf32, fp16 = compare.class_summaries(suite_comparison())
    assert fp16.cells == 2 and fp16.behind == 1
    assert fp16.geomean == pytest.approx((1.2 * 0.5) ** 0.5)
    assert fp16.worst == ("b", 128, 0.5, "autotuned")
    assert fp16.choices() == {"own": 1, "autotuned": 1}
    # an fp32 row stands in for tf32 (it meets the tf32 bound); a FAIL row is no cell
    assert tf32.ratios == [("a", 128, 2.0, "")] and tf32.missing == 1


def test_a_suite_record_carries_its_summary_and_reads_back(tmp_path):
    comparison = suite_comparison()
    record = results_io.to_record(comparison, "convlab compare --suite test")
    assert record["suite"] == "test" and record["classes"] == ["tf32", "fp16"]
    assert record["summary"][1]["behind_cudnn"] == 1
    assert record["rows"][0]["choice"] == "own"
    assert results_io.record_name(record).startswith("compare-suite-test-tf32-fp16-")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    again = results_io.from_record(results_io.load_record(path))
    assert again.suite == "test" and compare.class_summaries(again)[1].behind == 1


def test_the_summary_table_fits_80_columns():
    console = Console(width=80, record=True)
    console.print(report.suite_summary_table(suite_comparison(), 80))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "fp16" in text and "1 of 2" in text and "0.50x b b128" in text
    markdown = report.compare_markdown(suite_comparison())
    assert "## Summary: suite test" in markdown and "| fp16 | 2 | 1 of 2 | 0.77x |" in markdown


@pytest.mark.parametrize("args, message", [
    (["tune", "--kernel", "wgmma"], "give --layer or --suite"),
    (["tune", "--kernel", "wgmma", "--suite", "vgg16", "--bias"], "leave out --bias"),
    (["tune", "--kernel", "wgmma", "--layer", "1,2,9,9,4,3", "--batch", "2"],
     "--batch goes with --suite"),
    (["tune", "--kernel", "depthwise", "--suite", "alexnet"], "runs none of suite alexnet"),
    (["tune", "--kernel", "naive", "--suite", "alexnet"], "no tiling space to search"),
])
def test_tune_suite_argument_errors(args, message):
    out = CliRunner().invoke(main, args)
    assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output


def test_single_layers_run_a_layer_at_a_time_on_one_problem_per_layer():
    """In a suite (or --layer) comparison every variant of a layer shares one problem, so the
    inputs are drawn and the float64 sample computed once per layer, not once per row."""
    plan = compare.suite_plan("alexnet", "wgmma-fp16", "128", None)
    steps = list(compare._steps(plan, 128, plan.shapes_for(128)))
    layers = [next(iter(mine)) for _, mine, _ in steps]
    assert layers == sorted(layers, key=layers.index)  # grouped by layer
    for layer in set(layers):
        shared = {id(problems) for _, mine, problems in steps if layer in mine}
        assert len(shared) == 1
    assert len({id(problems) for _, _, problems in steps}) == len(set(layers)) == 5
    model = compare.plan("cudnn", "ece408", None, "10")
    assert all(problems is None for _, _, problems in compare._steps(model, 10,
                                                                      model.shapes_for(10)))


def test_the_variants_of_a_layer_share_its_random_trials(monkeypatch):
    """The trial problems of a layer and their float64 references are drawn once for all the
    variants compared on it; a variant wrong on them still fails."""
    computed = []
    real = compare.reference_output

    def counting(*args, **kwargs):
        computed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compare, "reference_output", counting)
    shapes = {"l": ConvShape(2, 3, 7, 7, 4, 3, pad=1, bias=True)}
    problems = compare.SharedLayer()
    cpu = get_variant("cpu")
    assert compare.random_trials(cpu, shapes, {"l": RELU}, shared=problems) == (True, "")
    assert len(computed) == compare.RANDOM_TRIALS
    assert compare.random_trials(cpu, shapes, {"l": RELU}, shared=problems) == (True, "")
    assert len(computed) == compare.RANDOM_TRIALS

    class Wrong(type(cpu)):
        name = "wrong"

        def prepare(self, shape, weights, epilogue=None, bias=None):
            return super().prepare(shape, weights * 1.01, epilogue, bias)

    ok, reason = compare.random_trials(Wrong(), shapes, {"l": RELU}, shared=problems)
    assert not ok and "random inputs, l" in reason


def test_a_layer_mode_compare_hands_each_layers_variants_one_problem(monkeypatch):
    """execute gives every variant of a layer the same SharedLayer, a fresh one per layer,
    and counts a layer's variant runs when interrupted."""
    import signal

    monkeypatch.setattr(compare, "require_cupy", lambda what: None)
    monkeypatch.setattr(peaks, "ceilings", lambda: peaks.Ceilings("test", 1000.0, 1e4, 4e4))
    monkeypatch.setattr(hardware, "device_info", lambda: {"name": "test"})
    seen = []

    def rows(variant, batch, model, policy, shapes, weights, verify, epilogues=None,
             shared=None):
        (layer, shape), = shapes.items()
        problems = shared
        seen.append((layer, variant.name, problems))
        if len(seen) == 7:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        return [compare.Row(variant.name, variant.precision, batch, layer, layer, shape)]

    monkeypatch.setattr(compare, "variant_rows", rows)
    plan = compare.suite_plan("alexnet", "wgmma-fp16", "128", None)
    result = compare.execute(plan, TimingPolicy())
    by_layer = {}
    for layer, _, problems in seen:
        by_layer.setdefault(layer, set()).add(id(problems))
    assert all(len(ids) == 1 for ids in by_layer.values())
    assert len({next(iter(ids)) for ids in by_layer.values()}) == len(by_layer)
    assert seen[0][2] is not None and len(seen) == 7
    total = sum(1 for _ in compare._steps(plan, 128, plan.shapes_for(128)))
    assert result.interrupted == f"stopped after 6 of {total} variant runs"


def test_the_plot_draws_every_reference_row_as_one():
    assert all(name.startswith(plot.REFERENCE_PREFIXES) for name in REFERENCE_VARIANTS)
