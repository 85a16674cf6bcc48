"""What a newcomer meets at 80 columns with the output piped (issue 17): hidden columns are
announced, code is never cut, errors name what was expected and which option was wrong, and
legends match the numbers. CliRunner's output is not a terminal, as in `convlab ... | cat`."""

import os
import re
from pathlib import Path

import numpy as np
import pytest
import click
from click.testing import CliRunner

from convlab import gpu, report
from convlab.bench import compare, results
from convlab.cli import main
from convlab.kernels import CUDNN_ROWS, get_variant
from convlab.models import DEFAULT_MODEL
from convlab.tables import Col, fitted_table
from convlab.userkernel.scaffold import scaffold

RESULTS = Path(__file__).parent.parent / "results" / "h100"
OLD_ECE408 = RESULTS / "compare-ece408-20261123T104454.json"
LAYER_RECORD = RESULTS / "compare-layer-64x64x56x56x64x3-p1-20261125T032540.json"
ALEXNET_RECORD = RESULTS / "compare-alexnet-20261125T032502.json"


pytestmark = pytest.mark.usefixtures("private_cache")


def piped(*args, width=80):
    out = CliRunner().invoke(main, [str(a) for a in args], terminal_width=width,
                             env={"COLUMNS": str(width)})
    assert "Traceback" not in out.output
    return out


def render(table, width=80) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(table)
    return console.export_text()


# --- 1. columns never vanish without notice ---------------------------------------------------

def test_a_table_that_hides_columns_says_which_and_how_to_see_them():
    cols = [Col("name", "left"), Col("a"), Col("bbbbbbbbbbbbbb", key=False, priority=1),
            Col("cccccccccccccc", key=False, priority=2)]
    rows = [["x", "1", "2", "3"]]
    narrow = render(fitted_table("t", cols, rows, width=20))
    assert "2 columns hidden: bbbbbbbbbbbbbb, cccccccccccccc; --wide shows them" in \
        " ".join(narrow.split())
    wide = render(fitted_table("t", cols, rows, width=20, wide=True), width=200)
    assert "hidden" not in wide


def test_a_column_note_is_printed_only_with_its_column():
    cols = [Col("name", "left"), Col("wide column header", key=False, note="about the wide one")]
    rows = [["x", "1"]]
    assert "about the wide one" not in render(fitted_table(None, cols, rows, width=10))
    assert "about the wide one" in render(fitted_table(None, cols, rows, width=80))


def test_hidden_parts_of_a_breakdown_fold_into_its_rest_column():
    cols = [Col("what", "left"), Col("conv", part=True), Col("pool pool pool", key=False,
            part=True), Col("other", rest=True), Col("total")]
    rows = [["run", 1.0, 0.25, 0.5, "1.75"]]
    text = render(fitted_table(None, cols, rows, width=30))
    line = next(ln for ln in text.splitlines() if ln.startswith("run"))
    assert line.split() == ["run", "1.0000", "0.7500", "1.75"]
    assert "other includes the hidden pool pool pool" in " ".join(text.split())


def test_list_at_80_columns_names_the_hidden_general_column():
    out = piped("list")
    assert out.exit_code == 0 and "hidden: general; --wide shows it" in out.output
    assert "general" in piped("list", "--wide").output.splitlines()[1]


def test_batch_sweep_parts_add_up_to_forward_at_80_columns(no_gpu):
    out = piped("run", "--kernel", "cpu", "--model", "ece408-low", "--batch", "1,2")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("batch "))
    headers = re.split(r"\s{2,}", lines[head].strip())
    assert "other" in headers and "pool" not in headers
    for line in lines[head + 2:head + 4]:
        cells = dict(zip(headers, line.split()))
        parts = sum(float(cells[h]) for h in ("conv ms", "other"))
        # Each cell is rounded to the decimals it shows (fewer from 10 ms up, which a slow or
        # busy CPU reaches): the sum may be off by half a last digit per cell.
        slack = sum(0.5 * 10.0 ** -len(cells[h].partition(".")[2])
                    for h in ("conv ms", "other", "forward"))
        assert parts == pytest.approx(float(cells["forward"]), abs=slack), line
    text = " ".join(out.output.split())
    assert "other includes the hidden pool, LRN, FC" in text
    assert "dev alloc" not in text  # the footnotes speak of shown columns only


def test_profile_breakdown_note_names_only_shown_columns():
    from convlab.profile.tables import steady_note

    some = steady_note(["batch", "HtoD", "conv", "pool", "FC", "DtoH", "other", "wall"])
    assert "LRN" not in some and "GPU busy" not in some and "pinned" not in some
    every = steady_note(["HtoD", "conv", "pool", "LRN", "FC", "DtoH", "sync", "other",
                         "dev alloc", "pinned", "GPU busy", "wall"])
    assert "LRN" in every and "GPU busy is their sum" in every and "pinned" in every


def test_check_always_shows_registers_shared_memory_spills_and_occupancy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scaffold("a_kernel_with_a_rather_long_name", "register-tiled", tmp_path)
    out = piped("check", "a_kernel_with_a_rather_long_name.cu", "--model", "alexnet")
    assert out.exit_code == 0, out.output
    header = next(ln for ln in out.output.splitlines() if ln.startswith("layer "))
    for column in ("regs", "smem", "spills", "occupancy"):
        assert column in header
    assert max(len(ln) for ln in out.output.splitlines()) <= 80
    assert "hidden:" in out.output


# --- 2. code is never cut ---------------------------------------------------------------------

def test_show_piped_prints_the_source_as_it_is():
    """Piped into a file, `show` once kept its line numbers and padded every line to 80
    columns: only --raw was usable."""
    source = get_variant("tiled").source.strip("\n")
    assert piped("show", "tiled").output == source + "\n"
    assert piped("show", "tiled", "--raw").output == source + "\n"


def test_show_wraps_long_source_lines_instead_of_cutting_them():
    """On an 80-column terminal (FORCE_COLOR makes rich treat the runner as one)."""
    source = get_variant("tiled").source
    long_lines = [ln for ln in source.splitlines() if len(ln) > 72]
    assert long_lines  # the test means something only with lines wider than the terminal
    out = CliRunner().invoke(main, ["show", "tiled"], terminal_width=80,
                             env={"COLUMNS": "80", "FORCE_COLOR": "1"})
    assert out.exit_code == 0
    text = click.unstyle(out.output)
    assert text.lstrip().startswith("1 ")  # numbered: the terminal's rendering
    flat = "".join(text.split())
    for line in long_lines:
        assert "".join(line.split()[-3:]) in flat, line


# --- 3. errors say what was expected ----------------------------------------------------------

@pytest.mark.parametrize("content,found", [
    (b"just some text\n", "a text file"),
    ("array", "a single NumPy array (float32, shape (3, 4))"),
    (b"", "empty"),
])
def test_a_wrong_weights_file_is_named_for_what_it_is(tmp_path, no_gpu, content, found):
    path = tmp_path / "bad.npy"
    if content == "array":
        np.save(path, np.zeros((3, 4), np.float32))
    else:
        path.write_bytes(content)
    out = piped("run", "--kernel", "cpu", "--batch", "10", "--model", "ece408", "--weights", path)
    assert out.exit_code == 1
    message = " ".join(out.output.split())
    assert found in message and "expected a .npz of model 'ece408' written by `convlab train`" \
        in message
    for leak in ("allow_pickle", "context manager", "TypeError", "ValueError"):
        assert leak not in message


def test_a_bad_layer_names_the_option_and_the_field_as_typed():
    out = piped("compare", "--layer", "64,64,56,56,64,3,0")
    assert out.exit_code == 1
    assert "--layer '64,64,56,56,64,3,0': stride" in out.output
    assert "ConvShape" not in out.output


# --- 4. impossible or malformed input is refused ----------------------------------------------

@pytest.mark.parametrize("block", ["4096", "0"])
def test_check_fails_when_no_layer_can_run(tmp_path, monkeypatch, block):
    monkeypatch.chdir(tmp_path)
    made = scaffold("mine", "naive", tmp_path).files[0]
    made.write_text(re.sub(r"(?m)^// convlab: block = .*$", f"// convlab: block = {block}",
                           made.read_text()))
    out = piped("check", made)
    assert out.exit_code == 1 and "no layer can run" in out.output


def test_an_empty_batch_entry_is_refused(no_gpu):
    out = piped("run", "--kernel", "cpu", "--batch", "1,,2")
    assert out.exit_code == 1 and "--batch '1,,2' has an empty entry" in out.output


def test_ladder_and_markdown_together_are_refused():
    out = piped("results", "show", "--ladder", "--markdown", OLD_ECE408)
    assert out.exit_code == 1 and "give one of them" in out.output


def test_an_unknown_arch_names_our_option_and_what_nvrtc_builds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scaffold("mine", "naive", tmp_path)
    out = piped("check", "mine.cu", "--arch", "foo")
    assert out.exit_code == 1
    assert "--arch 'foo'" in out.output and "sm_90" in out.output
    assert "nvrtc: error" not in out.output and "did not compile" not in out.output
    assert piped("check", "mine.cu", "--arch", "sm_90a").exit_code == 0


def test_a_layer_batch_is_limited_by_device_memory_not_the_test_set(monkeypatch):
    plan = compare.plan("naive", None, "64,64,56,56,64,3,1,1", "20000")
    assert plan.batches == [20000]
    shape = plan.shapes_for(20000)["layer"]

    class Runtime:
        @staticmethod
        def memGetInfo():
            return 8 * 2**30, 80 * 2**30

    class Cuda:
        runtime = Runtime

    class FakeCupy:
        cuda = Cuda

    monkeypatch.setattr(gpu, "_probe", lambda: (FakeCupy, ""))
    monkeypatch.setitem(__import__("sys").modules, "cupy", FakeCupy)
    with pytest.raises(Exception, match=r"needs about .* GiB of device memory.*8\.0 GiB free"):
        compare.check_layer_memory(shape)
    assert compare.layer_bytes(shape) > 8 * 2**30


# --- 5. legends that match the numbers --------------------------------------------------------

def test_an_old_record_is_rendered_with_the_basis_its_legend_names():
    comparison = results.from_record(results.load_record(OLD_ECE408))
    for row in comparison.rows:
        if row.valid and row.speedup_cudnn is not None:
            basis = compare.best_cudnn(comparison.rows, row)
            assert basis.variant in CUDNN_ROWS[row.precision]
            assert row.cudnn_basis == basis.variant
    tf32 = [r for r in comparison.rows if r.variant == "cudnn-tf32" and r.valid]
    assert tf32 and all(r.speedup_cudnn == pytest.approx(1.0) for r in tf32)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("compare-*.json")), ids=lambda p: p.name)
def test_our_floors_count_the_arithmetic_issued_and_stay_below_100(path):
    comparison = results.from_record(results.load_record(path))
    cudnn = {name for names in CUDNN_ROWS.values() for name in names}
    for row in comparison.rows:
        if row.valid and row.pct_floor is not None and row.variant not in cudnn:
            assert row.pct_floor < 100, (row.variant, row.layer, row.batch, row.pct_floor)
    bases = {r.variant: r.floor_basis for r in comparison.rows if r.valid}
    if "pipelined-3xtf32" in bases:
        assert bases["pipelined-3xtf32"] in ("3xTF32", "copy")


def test_winograd_and_3xtf32_floors_use_what_they_issue():
    shape = compare.parse_layer("64,64,56,56,64,3,1,1")
    assert get_variant("pipelined-3xtf32").arithmetic(shape).flops == 3 * shape.flops
    assert get_variant("pipelined-3xtf32").arithmetic(shape).rate == "tf32"
    winograd = get_variant("winograd").arithmetic(shape)
    assert winograd.flops == pytest.approx(shape.flops * 16 / 36)
    assert get_variant("tiled").arithmetic(shape).flops == shape.flops


def test_the_layer_record_is_titled_by_its_shape():
    out = piped("results", "show", LAYER_RECORD)
    assert "layer 64x56x56->64x56x56 3x3 p1" in out.output
    assert "layer: layer" not in out.output
    assert "%floor of winograd: FP32 F(2x2)" in out.output


def test_the_fastest_row_is_marked_in_a_pipe():
    out = piped("results", "show", ALEXNET_RECORD)
    assert out.exit_code == 0
    rows = [ln for ln in out.output.splitlines() if re.match(r"\s*\d+\s+\S+\s+\w+\s+PASS\*", ln)]
    assert rows  # a marked row in every table, no styling needed
    assert "each layer: PASS*" in " ".join(out.output.split())
    assert max(len(ln) for ln in out.output.splitlines()) <= 80


# --- 6. numbers that disagree say why ---------------------------------------------------------

def test_cpu_op_time_and_step_table_say_what_each_includes(no_gpu):
    out = piped("run", "--kernel", "cpu", "--model", "ece408-low", "--batch", "20")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "Op Time is the conv alone" in text
    passes = int(re.search(r"median of (\d+) passes", text).group(1))
    assert passes >= 3


# --- 7. small ---------------------------------------------------------------------------------

def test_new_points_to_the_kernel_file_docs(tmp_path):
    made = scaffold("mine", "naive", tmp_path).files[0]
    assert "docs/kernel-files.md" in made.read_text()
    assert (Path(__file__).parent.parent / "docs" / "kernel-files.md").exists()


@pytest.mark.parametrize("args", [
    ["compare", "--layer", "64,64,56,56,64,3,1,1", "--batch", "8"],
    ["tune", "--layer", "64,64,56,56,64,3,1,1", "--kernel", "pipelined"],
])
def test_errors_start_on_the_first_line(no_gpu, args):
    out = piped(*args)
    assert out.exit_code == 1 and out.output.startswith("Error: "), repr(out.output[:80])


@pytest.mark.parametrize("args", [
    ["run", "--repeat", "0"], ["run", "--images", "0"], ["run", "--weights", "."],
    ["check", "."], ["check", "--batch", "0", "x.cu"], ["results", "show", "."],
    ["compare", "--timing", "nope"], ["tune", "--jobs", "0"], ["run", "--bogus"],
    ["nosuch"], ["--bogus"],
])
def test_a_usage_mistake_click_finds_is_one_line_like_ours(no_gpu, args):
    """click's own range, choice, path and option errors read as convlab's do: one line that
    starts with the error, exit status 1, no usage block."""
    out = piped(*args)
    lines = out.output.strip().splitlines()
    assert out.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), out.output
    assert "--help')" in lines[0] and "Usage:" not in out.output


def test_readme_first_command_runs_the_default_model():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    first = next(ln for ln in readme.splitlines() if "convlab run" in ln)
    model = re.search(r"--model (\S+)", first)
    assert model is None or model.group(1) == DEFAULT_MODEL
    assert f"[default: {DEFAULT_MODEL}]" in piped("run", "--help", width=200).output


def test_report_module_keeps_the_best_mark_out_of_the_time_cell():
    comparison = results.from_record(results.load_record(LAYER_RECORD))
    best = next(r for r in comparison.rows if r.best)
    cells = report.compare_cells(best)
    assert cells[3] == "PASS*" and not cells[4].startswith("*")


def test_a_failed_op_time_line_names_the_check_that_failed():
    """Under compute-sanitizer the timer's guard fired and every such layer's line said the
    output did not match the reference, which it did."""
    from convlab import report
    from convlab.bench import guard
    from convlab.bench.records import LayerResult
    from convlab.gpu.timer import Timing
    from convlab.oracle.verify import Check
    from convlab.shapes import ConvShape

    def line(check):
        layer = LayerResult("conv1", "conv1", ConvShape(2, 3, 9, 9, 4, 3), None,
                            Timing([0.5, 0.5, 0.5]), check, 0.0)
        return report.op_time_line(layer)

    good = Check(True, 1e-7, 0.01)
    wrong = Check(False, 0.5, 80.0, reason="3 of 392 outputs are wrong")
    assert line(good) == "Op Time: 0.000500"
    assert line(wrong).endswith("(FAIL: output does not match the reference)")
    timed = line(guard.timer_failure(good, "work outside the timed stream: ..."))
    assert "timer's guard" in timed and "output matches" in timed
    both = line(guard.timer_failure(wrong, "work outside the timed stream: ..."))
    assert "timer's guard, and the output does not match" in both


def test_messages_name_the_real_problem_first(tmp_path, no_gpu):
    """An empty file or one without a header is said to be that (not "the header states no
    block"); a --weights path that is not there is a missing file (not a model to train)."""
    (tmp_path / "empty.cu").write_text("")
    (tmp_path / "notes.cu").write_text("some notes\n")
    empty = piped("check", tmp_path / "empty.cu")
    assert empty.exit_code == 1 and "the file is empty" in empty.output, empty.output
    notes = piped("check", tmp_path / "notes.cu")
    assert notes.exit_code == 1 and "not a kernel file" in notes.output, notes.output
    missing = piped("run", "--weights", tmp_path / "missing.npz", "--batch", "10")
    assert missing.exit_code == 1, missing.output
    assert missing.output.strip() == f"Error: {tmp_path / 'missing.npz'}: no such file"


def test_results_show_reads_the_json_of_a_markdown_twin(tmp_path):
    """The README links the .md of each record; `results show` on it reads its .json."""
    shown = piped("results", "show", ALEXNET_RECORD.with_suffix(".md"))
    assert shown.exit_code == 0, shown.output
    assert shown.output == piped("results", "show", ALEXNET_RECORD).output
    (tmp_path / "lone.md").write_text("# a table\n")
    lone = piped("results", "show", tmp_path / "lone.md")
    assert lone.exit_code == 1 and "lone.json, which is not beside it" in lone.output


def test_models_prints_json_as_list_does():
    """Every command that prints a table has --json; `models` had none."""
    import json

    from convlab.models import MODELS, get_model

    records = json.loads(piped("models", "--json").output)
    assert [r["name"] for r in records] == list(MODELS)
    alexnet = next(r for r in records if r["name"] == "alexnet")
    assert alexnet["input"] == list(get_model("alexnet").input_shape)
    assert list(alexnet["conv_layers"]) == ["conv1", "conv2", "conv3", "conv4", "conv5"]
    ece408 = next(r for r in records if r["name"] == "ece408")
    assert ece408["expected_accuracy"]["10000"] == 0.8925 and ece408["error"] is None


@pytest.mark.parametrize("old, new, args", [
    ("--from", "--image-dir", ["run", "--model", "alexnet", "--batch", "1", "--images", "2"]),
    ("--layer", "--ncu-layer", ["profile", "--ncu"]),
])
def test_an_option_renamed_for_one_meaning_keeps_its_old_spelling_for_now(tmp_path, no_gpu,
                                                                          old, new, args):
    """run's --from (a folder) and profile's --layer (a name) read like new's --from (a
    variant) and compare's --layer (a shape): they are --image-dir and --ncu-layer now, and
    the old spellings still work, hidden from --help, with a note."""
    value = str(tmp_path) if new == "--image-dir" else "conv1"
    via_old, via_new = piped(*args, old, value), piped(*args, new, value)
    assert f"note: {'profile --layer' if new == '--ncu-layer' else old} is now {new}" in via_old.output
    assert via_old.output.splitlines()[-1] == via_new.output.splitlines()[-1]
    assert via_old.exit_code == via_new.exit_code
    command_help = piped(args[0], "--help").output
    assert new in command_help and f"{old} " not in command_help.replace(new, "")
    both = piped(*args, old, value, new, value)
    assert both.exit_code == 1 and "give one of them" in both.output


def test_a_long_run_says_what_it_is_doing_on_a_terminal_only(no_gpu):
    """The CPU run was silent for tens of seconds between "Loading model... done" and its first
    Op Time: it says what it times now, on stderr while a terminal watches, and the next line
    of output replaces it; a pipe gets none of it."""
    import io

    from convlab.bench import lab
    from convlab.cli import StatusLine

    events = []
    lab.execute_run(lab.plan_run("ece408", kernel="cpu", batches="10", repeat=2),
                    lambda name, payload=None: events.append((name, payload)))
    working = [payload for name, payload in events if name == "working"]
    assert working == ["timing conv1", "timing conv2",
                       "timing whole passes step by step", "the end-to-end pass and its check"]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    seen = Terminal()
    line = StatusLine(stream=seen)
    line.show("timing conv1")
    line.clear()
    line.clear()
    assert seen.getvalue() == "\r\x1b[Ktiming conv1...\r\x1b[K"
    quiet = Terminal()
    StatusLine(quiet=True, stream=quiet).show("timing conv1")
    piped_stream = io.StringIO()
    StatusLine(stream=piped_stream).show("timing conv1")
    assert quiet.getvalue() == piped_stream.getvalue() == ""
    out = piped("run", "--kernel", "cpu", "--batch", "10")
    assert out.exit_code == 0 and "timing" not in out.output


@pytest.mark.parametrize("args", [[], ["results"]])
def test_a_group_without_arguments_shows_its_help(args):
    out = piped(*args)
    assert out.output.startswith("Usage: ") and "Error" not in out.output, out.output


def test_the_step_tables_title_keeps_its_total_on_its_line_at_80_columns():
    """The title once read "forward pass by step (CUDA events between steps, median of 10
    passes):" and wrapped its total, 2.362 ms, onto a line of its own over the table."""
    from convlab import report
    from convlab.bench.records import RunResult, StepTime

    steps = [StepTime("conv1+relu1", "conv", "wgmma-3xtf32 conv1+relu1", 0.6551, None),
             StepTime("norm1+pool1", "lrn", "LRN 5 + max-pool 3x3/2 norm1+pool1", 0.0953, None)]
    result = RunResult("alexnet", "wgmma-split-bf16", "fp32", 128, [], None, None, 0, 0.1, 0.0,
                       0.0, device={"name": "NVIDIA H100 80GB HBM3"}, steps=steps,
                       step_passes=10)
    lines = render(report.steps_table(result, width=80)).splitlines()
    assert lines[0].strip() == ("forward pass by step (CUDA events, median of 10 passes): "
                                "0.750 ms")


def test_a_run_the_kernel_cannot_finish_says_which_fallback_would():
    """VGG-16 in the fp32 class on wgmma-split-bf16: its first three convs reduce under 1,024
    terms; the error names them and ends with the flag that runs them on wgmma-3xtf32."""
    out = piped("run", "--model", "vgg16", "--batch", "1", "--kernel", "wgmma-split-bf16")
    assert out.exit_code == 1
    line = " ".join(out.output.split())
    assert line.startswith("Error: kernel 'wgmma-split-bf16' does not support features.0 ")
    assert line.endswith("Use --fallback wgmma-3xtf32 to run those layers with it.")


def test_a_fallback_note_counts_its_layers():
    from convlab.bench.lab import fallback_note

    assert fallback_note(["conv1"], "wgmma-3xtf32", "wgmma-split-bf16") == (
        "layer conv1 ran with 'wgmma-3xtf32' ('wgmma-split-bf16' does not support it)")
    assert fallback_note(["conv1", "conv2"], "naive", "fused").startswith(
        "layers conv1, conv2 ran with 'naive'")
