"""Rich renderings of convlab's records: variants, models, device, runs and comparisons.

Every table is built by `tables.fitted_table` (key columns always, optional ones while they
fit, a line naming the hidden ones). Long reasons (why a row FAILed or was skipped) go below a
table, never into a column.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from .bench import guard
from .bench.compare import class_summaries
from .bench.records import LayerResult, RunResult
from .gpu.timer import QUEUED, SINGLE
from .net.torch_forward import allowed_differ
from .tables import STATUS_STYLE, Col, fitted_table, fmt_err, fmt_ms, fmt_num, status_text

# --- list, models, device -------------------------------------------------------------------

def variants_table(variants, width=None, wide=False) -> RenderableType:
    cols = [Col("name", "left", style="bold cyan"), Col("precision", "left"),
            Col("runs on", "left"), Col("general", "left", key=False, priority=1),
            Col("summary", "left", wrap=True)]
    rows = []
    for v in variants:
        where = "GPU" if v.on_gpu else "CPU"
        general = ",".join(sorted(v.general)) or "-"
        rows.append([v.name, v.precision, where, general, v.summary])
    return fitted_table("convlab variants (ladder order)", cols, rows, width, wide)


def models_table(rows, width=None, wide=False) -> RenderableType:
    """rows: (spec, weights or None, error message or None)."""
    cols = [Col("name", "left", style="bold cyan"), Col("input", "left"),
            Col("expected accuracy (10/100/1000/10000)", "left", wrap=True),
            Col("course", key=False, priority=1), Col("layers", "left", key=False, wrap=True,
                                                     priority=2)]
    out = []
    for spec, weights, error in rows:
        if error is not None:
            expected = Text(error, style="red")
        elif weights is not None and weights.expected_accuracy:
            acc = weights.expected_accuracy
            expected = " / ".join(f"{acc[n]:.4f}" for n in sorted(acc))
        else:
            expected = "top-1 vs the float64 reference (random input)"
        course = "-" if spec.course_accuracy is None else f"{spec.course_accuracy:.4f}"
        out.append([spec.name, "x".join(map(str, spec.input_shape)), expected, course,
                    spec.describe()])
    return fitted_table("convlab models", cols, out, width, wide)


def models_json(rows) -> list[dict]:
    """models_table's rows as records: each model's input, task, conv layers (their shapes at
    batch 1) and expected accuracies, or why its weights could not be read."""
    out = []
    for spec, weights, error in rows:
        accuracy = weights.expected_accuracy if weights is not None else {}
        out.append({"name": spec.name, "task": spec.task, "input": list(spec.input_shape),
                    "layers": spec.describe(), "course_accuracy": spec.course_accuracy,
                    "expected_accuracy": {str(n): a for n, a in sorted(accuracy.items())},
                    "conv_layers": {name: shape.as_dict()
                                    for name, shape in spec.conv_shapes(1).items()},
                    "error": error})
    return out


def models_layers(rows) -> list[str]:
    return [f"{spec.name}: {spec.describe()}" for spec, _, _ in rows]


def device_table(info: dict, ceilings=None, width=None) -> RenderableType:
    rows = [[label, str(info[key])] for key, label in (
        ("name", "device"), ("compute_capability", "compute capability"),
        ("multiprocessors", "multiprocessors"), ("memory_gib", "memory (GiB)"),
        ("l2_mib", "L2 (MiB)"), ("driver", "CUDA driver API"), ("cuda_runtime", "CUDA runtime"),
        ("cupy", "CuPy"))]
    if ceilings is not None:
        rows += [["copy bandwidth", f"{ceilings.copy_gbps:,.0f} GB/s (device-to-device, read+write)"],
                 ["FP32 rate", f"{ceilings.fp32_gflops / 1e3:,.1f} TFLOP/s (cuBLAS SGEMM 8192^3)"],
                 ["TF32 rate", f"{ceilings.tf32_gflops / 1e3:,.1f} TFLOP/s (mma.sync m16n8k8 peak)"],
                 ["FP16 rate", f"{(ceilings.fp16_gflops or 2 * ceilings.tf32_gflops) / 1e3:,.1f} "
                               "TFLOP/s (mma.sync m16n8k16 peak)"]]
        rows += [[label, f"{rate / 1e3:,.1f} TFLOP/s (wgmma {shape} peak)"]
                 for label, rate, shape in (("TF32 wgmma rate", ceilings.wgmma_tf32_gflops, "m64n256k8"),
                                            ("FP16 wgmma rate", ceilings.wgmma_fp16_gflops, "m64n256k16"))
                 if rate]
        rows += [["ceilings measured", ceilings.measured_at]]
    return fitted_table("GPU", [Col("", "left", style="bold"), Col("", "left", wrap=True)], rows,
                        width, show_header=False)


# --- convlab run ------------------------------------------------------------------------------

OP_TIME_NOTE = ("Op Time is the conv alone, the median of its repeated runs (after warm-up) on "
                "inputs that change every run; the step table times it inside whole passes")


def run_table(result: RunResult, width=None, wide=False) -> RenderableType:
    cols = [Col("layer", "left", style="bold"), Col("shape", "left", key=False, priority=1),
            Col("kernel", "left", key=False, priority=6), Col("Op Time ms", note=OP_TIME_NOTE),
            Col("min", key=False, priority=4), Col("IQR", key=False, priority=7),
            Col("runs", key=False, priority=5), Col("GFLOP/s", key=False, priority=2),
            Col("GB/s", key=False, priority=8), Col("err/bound", key=False, priority=3),
            Col("rel err", key=False, priority=9), Col("tiling", "left", key=False, priority=6),
            Col("check", "left")]
    rows = []
    for layer in result.layers:
        t = layer.timing
        ok = layer.check.passed
        style = None if ok else "dim"
        rows.append([layer.label, layer.shape.brief(), layer.variant,
                     Text(fmt_ms(t.median_ms), style=style), Text(fmt_ms(t.min_ms), style=style),
                     f"{t.spread_pct:.0f}%", str(t.n), Text(f"{layer.gflops:,.0f}", style=style),
                     Text(f"{layer.gbps:,.0f}", style=style), f"{layer.check.bound_ratio:.2g}",
                     fmt_err(layer.check.max_rel_error), layer.choice or "-", status_text(ok)])
    title = (f"{result.model}, kernel '{result.kernel}' ({result.precision}), batch {result.batch}:"
             " conv Op Times")
    return fitted_table(title, cols, rows, width, wide)


def steps_table(result: RunResult, width=None, wide=False) -> RenderableType | None:
    """Every step of the forward pass, timed inside whole passes."""
    if not result.steps:
        return None
    total = sum(s.median_ms for s in result.steps) or 1.0
    cols = [Col("step", "left", style="bold"), Col("category", "left", key=False, priority=2),
            Col("kernel", "left", key=False, priority=1), Col("ms"), Col("share"),
            Col("check", "left")]
    rows = []
    for s in result.steps:
        check = "-" if s.check is None else status_text(s.check.passed)
        rows.append([s.label, s.category, s.kernel, fmt_ms(s.median_ms),
                     f"{100 * s.median_ms / total:.1f}%", check])
    # Short enough that the total stays on the title's line over an 80-column table.
    clock = "CUDA events" if result.device else "host clock"
    n = result.step_passes
    passes = ("one pass" if n == 1 else f"median of {n} passes") if n else "median of passes"
    title = f"forward pass by step ({clock}, {passes}): {total:.3f} ms"
    return fitted_table(title, cols, rows, width, wide)


def torch_table(result: RunResult, width=None, wide=False) -> RenderableType | None:
    """PyTorch's candidates for the same forward pass (run --pytorch), fastest marked."""
    if not result.torch_rows:
        return None
    cols = [Col("PyTorch", "left", style="bold"), Col("ms"), Col("ratio"),
            Col("top-1 differ"), Col("note", "left", wrap=True)]
    rows = []
    for d in result.torch_rows:
        ms = d.get("ms")
        fastest = ms is not None and ms == result.torch_ms
        ratio = ms / result.forward_ms if ms and result.forward_ms else None
        wrong = d.get("differ") is not None and d["differ"] > allowed_differ(d["precision"],
                                                                             result.batch)
        note = "fastest" if fastest else "too many top-1 differ: no baseline" if wrong else ""
        rows.append([Text(f"{d['layout']} {d['mode']}", style="bold green" if fastest else None),
                     fmt_num(ms, ".3f"), fmt_num(ratio, ".2f"), fmt_num(d.get("differ"), "d"),
                     note + (d.get("error") or "")])
    title = f"PyTorch ({result.precision}), same input; ratio: its ms / our forward's"
    return fitted_table(title, cols, rows, width, wide)


def failure_lines(result: RunResult) -> list[str]:
    lines = [f"{layer.label}: {layer.check.reason}" for layer in result.layers
             if not layer.check.passed]
    lines += [f"{s.label}: {s.check.reason}" for s in result.steps
              if s.check is not None and not s.check.passed]
    return lines


def op_time_line(layer: LayerResult) -> str:
    """The course's line per layer; a failure says which check failed: the output against the
    reference, or the timer's guard (work it could not account for), which says nothing of
    the output."""
    line = f"Op Time: {layer.timing.median_ms / 1e3:.6f}"
    reason = layer.check.reason
    if layer.check.passed:
        return line
    if not reason.startswith(guard.TIMER_REASON):
        return f"{line}  (FAIL: output does not match the reference)"
    if guard.ALSO in reason:
        return (f"{line}  (FAIL: the timer's guard, and the output does not match the "
                f"reference)")
    return f"{line}  (FAIL: the timer's guard found work outside the timing; output matches)"


def course_line(result: RunResult) -> str:
    """The course's last line: Correctness for Fashion-MNIST, top-1 agreement for ImageNet."""
    if result.accuracy is not None:
        return f"Correctness: {result.accuracy:.4f} Model: {result.model}"
    return (f"Top-1 vs float64: {result.predictions_differ} of {result.batch} differ, max |p - p64| "
            f"{fmt_err(result.max_prob_error or 0.0)} Model: {result.model}")


def flips_text(result: RunResult) -> str:
    """Why the differing images differ: their float64 top-2 margins against the most any
    probability moved (a flip needs a margin below twice that)."""
    margins = ", ".join(f"{f['margin']:.2g}" for f in sorted(result.top1_flips,
                                                            key=lambda f: f["margin"]))
    return (f"their float64 top-2 margins {margins}; {result.near_ties} of {result.batch} "
            f"images have margins below 2 x max |p - p64|")


def run_summary(result: RunResult, width=None) -> RenderableType:
    rows = []
    if result.accuracy is not None:
        acc = Text(f"{result.accuracy:.4f}")
        acc.append(f"  (CPU reference {result.expected_accuracy:.4f}; "
                   f"{result.predictions_differ} of {result.batch} predictions differ)",
                   style="green" if result.predictions_differ == 0 else "yellow")
        rows.append(["accuracy", acc])
    else:
        top1 = Text(f"{result.predictions_differ} of {result.batch} differ from the float64 "
                    f"forward pass; max |p - p64| {fmt_err(result.max_prob_error or 0.0)}",
                    style="green" if result.predictions_differ == 0 else "yellow")
        if result.top1_flips:
            top1.append(f"; {flips_text(result)}")
        rows.append(["top-1", top1])
    verdict = status_text(result.passed)
    if not result.passed:
        verdict.append(": a layer failed verification or predictions differ from the reference")
    rows.append(["verdict", verdict])
    if result.device is None:
        rows.append(["compile time", "none (the cpu variant is NumPy)"])
    else:
        rows.append(["compile time", f"{result.compile_s:.2f} s (NVRTC + module load; cached on disk)"])
    if result.forward_ms is not None and result.device is not None:
        how = "CUDA graph replay" if result.graph else "one launch per step"
        line = f"{result.forward_ms:.3f} ms ({how}, device-resident input)"
        if result.graph and result.eager_forward_ms is not None:
            line += f"; {result.eager_forward_ms:.3f} ms launched step by step"
        rows.append(["forward", line])
    if result.peak_bytes is not None:
        rows.append(["device memory", memory_line(result)])
    if result.torch_ms is not None:
        ratio = result.torch_ms / result.forward_ms if result.forward_ms else float("nan")
        rows.append(["PyTorch best", f"{result.torch_ms:.3f} ms ({result.torch_note}); ours is "
                                     f"{ratio:.2f}x as fast"])
    elif result.torch_note:
        rows.append(["PyTorch", f"not measured: {result.torch_note}"])
    if result.htod_ms is not None:
        rows.append(["copies", f"HtoD {result.htod_ms:.3f} ms, DtoH {result.dtoh_ms:.3f} ms "
                               "(pinned host buffers)"])
    rows.append(["end-to-end", f"{result.end_to_end_s * 1e3:.2f} ms (host images in, predictions out)"])
    rows.append(["wall time", f"{result.wall_s:.2f} s (whole run)"])
    if result.device:
        rows.append(["device", result.device["name"]])
    for note in result.notes:
        rows.append(["note", Text(note)])
    return fitted_table(None, [Col("", "left", style="bold"), Col("", "left", wrap=True)], rows,
                        width, show_header=False, box=None)


def sweep_table(results: list[RunResult], width=None, wide=False) -> RenderableType:
    """One row per batch size: where the time of a forward pass goes (the assignment's table)."""
    cols = [Col("batch"), Col("conv ms", part=True), Col("pool", key=False, priority=3, part=True),
            Col("LRN", key=False, priority=4, part=True),
            Col("FC", key=False, priority=2, part=True),
            Col("other", rest=True, note="other: softmax, top-1, activations not fused and "
                                         "residual adds"),
            Col("HtoD", key=False, priority=5), Col("DtoH", key=False, priority=7),
            Col("forward", note="forward: the whole pass; the parts are its steps timed one by "
                                "one inside passes, so they add up to about it"),
            Col("end-to-end"), Col("PyTorch", key=False, priority=1), Col("x PyTorch"),
            Col("check", "left")]
    rows = []
    for r in results:
        other = r.time_in("softmax") + r.time_in("activation") + r.time_in("add")
        ratio = (r.torch_ms / r.forward_ms) if r.torch_ms and r.forward_ms else None
        rows.append([str(r.batch), r.time_in("conv"), r.time_in("pool"), r.time_in("lrn"),
                     r.time_in("fc"), other, fmt_num(r.htod_ms, ".3f"), fmt_num(r.dtoh_ms, ".3f"),
                     fmt_num(r.forward_ms, ".3f"), f"{r.end_to_end_s * 1e3:.3f}",
                     fmt_num(r.torch_ms, ".3f"), fmt_num(ratio, ".2f"), status_text(r.passed)])
    first = results[0]
    title = (f"{first.model}, kernel '{first.kernel}' ({first.precision}): ms per forward pass "
             f"by batch")
    return fitted_table(title, cols, rows, width, wide)



def _md(cell) -> str:
    return str(cell).replace("|", "\\|")


def _md_table(headers: list[str], rows: list[list], align: str) -> list[str]:
    """A markdown table; `align` has an "l" or "r" per column."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines + [""]


def fmt_mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2 ** 20:,.0f}"


def memory_line(result: RunResult) -> str:
    """What our network holds, and the least PyTorch's eager forward peaked at (either
    layout), where it ran."""
    line = f"{fmt_mib(result.peak_bytes)} MiB held by our network (weights, input, buffers)"
    eager = [d["peak_bytes"] for d in result.torch_rows
             if d.get("mode") == "eager" and d.get("peak_bytes")]
    return line + (f"; PyTorch eager's peak {fmt_mib(min(eager))} MiB" if eager else "")


def _run_markdown(result: RunResult) -> list[str]:
    lines = [f"## {result.model}, kernel '{result.kernel}' ({result.precision}), "
             f"batch {result.batch}", ""]
    if result.layers:
        lines += _md_table(
            ["layer", "shape", "kernel", "Op Time ms", "GFLOP/s", "err/bound", "tiling", "check"],
            [[layer.label, layer.shape.brief(), layer.variant, fmt_ms(layer.timing.median_ms),
              f"{layer.gflops:,.0f}", f"{layer.check.bound_ratio:.2g}", layer.choice or "-",
              "PASS" if layer.check.passed else "FAIL"] for layer in result.layers], "lllrrrll")
    if result.torch_rows:
        rows = []
        for d in result.torch_rows:
            ms = d.get("ms")
            ratio = ms / result.forward_ms if ms and result.forward_ms else None
            note = "fastest" if ms is not None and ms == result.torch_ms else d.get("error") or ""
            rows.append([f"{d['layout']} {d['mode']}", fmt_num(ms, ".3f"), fmt_num(ratio, ".2f"),
                         fmt_mib(d.get("peak_bytes")), fmt_num(d.get("differ"), "d"), note])
        lines += [f"PyTorch ({result.precision}), same input; ratio: its ms / our forward's:", ""]
        lines += _md_table(["PyTorch", "ms", "ratio", "peak MiB", "top-1 differ", "note"], rows,
                           "lrrrrl")
    for line in failure_lines(result):
        lines += [f"- FAIL {line}"]
    summary = [("top-1" if result.accuracy is None else "accuracy", course_line(result)),
               ("verdict", "PASS" if result.passed else "FAIL")]
    if result.forward_ms is not None and result.device is not None:
        how = "CUDA graph replay" if result.graph else "one launch per step"
        rate = result.batch / (result.forward_ms / 1e3)
        summary.append(("forward", f"{result.forward_ms:.3f} ms ({how}, device-resident input), "
                                   f"{rate:,.0f} images/s"))
    if result.peak_bytes is not None:
        summary.append(("device memory", memory_line(result)))
    if result.torch_ms is not None and result.forward_ms:
        summary.append(("PyTorch best", f"{result.torch_ms:.3f} ms ({result.torch_note}); ours "
                                        f"is {result.torch_ms / result.forward_ms:.2f}x as fast"))
    elif result.torch_note:
        summary.append(("PyTorch", f"not measured: {result.torch_note}"))
    summary.append(("end-to-end", f"{result.end_to_end_s * 1e3:.2f} ms (host images in, "
                                  "predictions out)"))
    summary += [("note", note) for note in result.notes]
    return lines + [f"- {name}: {_md(text)}" for name, text in summary] + [""]


def run_markdown(record: dict, runs: list) -> str:
    """A saved run record (bench.saved_runs) as markdown: each batch's conv layers, PyTorch's
    candidates and the summary."""
    device = next((r.device for r in runs if getattr(r, "device", None)), None)
    where = device["name"] if device else "the CPU"
    lines = [f"# convlab run: {runs[0].model}, kernel '{runs[0].kernel}'", "",
             f"`{record['command'] or 'convlab run'}` on {where}, {record['timestamp']}, "
             f"convlab {record['convlab_version']}"
             + (f" ({record['git_commit']})" if record.get("git_commit") else ""), ""]
    for result in runs:
        if isinstance(result, RunResult):
            lines += _run_markdown(result)
        else:
            lines += [f"## {result.model}, batch {result.batch}: FAIL", "", f"- {result.reason}",
                      ""]
    return "\n".join(lines)

# --- convlab compare -------------------------------------------------------------------------

COMPARE_COLUMNS = [
    Col("batch"), Col("variant", "left"), Col("prec", "left"), Col("check", "left"),
    Col("ms"), Col("min ms", key=False, priority=4), Col("RSE", key=False, priority=6),
    Col("runs", key=False, priority=7), Col("GFLOP/s", key=False, priority=1),
    Col("GB/s", key=False, priority=5), Col("%floor"), Col("floor", "left", key=False, priority=3),
    Col("x naive", key=False, priority=3),
    Col("x cuDNN"), Col("rel err", key=False, priority=0), Col("err/bound", key=False, priority=2),
    Col("accuracy", key=False, priority=8), Col("tiling", "left", key=False, priority=2),
]


BEST_MARK = "*"  # after PASS on the fastest row of a layer: survives a pipe, bold or not


def compare_cells(row) -> list[str]:
    """A row as text cells; a row that did not PASS shows no speed at all."""
    t = row.timing if row.valid else None
    acc = "-" if row.accuracy is None else f"{row.accuracy:.4f}"
    if row.predictions_differ:
        acc += f" ({row.predictions_differ} differ)"
    ratio = getattr(row, "bound_ratio", None)
    return [
        str(row.batch), row.variant, row.precision, row.status + (BEST_MARK if row.best else ""),
        "-" if t is None else fmt_ms(t.median_ms), "-" if t is None else fmt_ms(t.min_ms),
        "-" if t is None else f"{100 * t.rse:.1f}%", "-" if t is None else str(t.n),
        fmt_num(row.gflops, ",.0f"), fmt_num(row.gbps, ",.0f"), fmt_num(row.pct_floor, ".0f"),
        (row.floor_basis or "-") if row.valid else "-",
        fmt_num(row.speedup_naive, ".2f"), cudnn_ratio(row),
        "-" if row.max_rel_error is None or not row.valid else fmt_err(row.max_rel_error),
        "-" if ratio is None or not row.valid else f"{ratio:.2g}", acc,
        row.choice or "-",
    ]


def cudnn_layout(row) -> str:
    """Which reference row a speedup divides by: cuDNN's layout, or cuBLAS's "gemm" ("" in
    records from before both layouts)."""
    basis = getattr(row, "cudnn_basis", "")
    if basis.startswith("cublas"):
        return "gemm"
    return "nhwc" if "nhwc" in basis else "nchw" if basis else ""


def cudnn_ratio(row, unit: str = "") -> str:
    """The speedup over the fastest cuDNN row of the class, with that row's layout named."""
    if row.speedup_cudnn is None:
        return "-"
    return f"{row.speedup_cudnn:.2f}{unit} {cudnn_layout(row)}".rstrip()


def row_notes(row, bullet: str = "") -> list[str]:
    """Lines below a layer's table for one row: why it did not PASS, what its op chose."""
    lines = []
    if row.status != "PASS":
        lines.append(f"{bullet}{row.status} {row.variant} @ batch {row.batch}: {row.reason}")
    if getattr(row, "note", ""):
        lines.append(f"{bullet}{row.variant} @ batch {row.batch}: {row.note}")
    return lines


def _layers(comparison) -> dict[tuple, list]:
    """The rows of each (layer, epilogue), in the order the layers first appear."""
    groups: dict[tuple, list] = {}
    suite = comparison.suite
    for row in comparison.rows:
        groups.setdefault((row.layer, row.batch if suite else row.epilogue), []).append(row)
    return groups


SUMMARY_COLUMNS = [Col("class", "left"), Col("cells"), Col("behind cuDNN"), Col("geomean"),
                   Col("worst", "left", wrap=True), Col("tilings", "left", key=False, priority=1)]


def suite_summary_rows(comparison) -> list[list[str]]:
    """Per class of a suite run: its cells against cuDNN's fastest row of the class."""
    out = []
    for summary in class_summaries(comparison):
        worst = summary.worst
        cells = f"{summary.cells}" + (f" (+{summary.missing} unmatched)" if summary.missing else "")
        out.append([
            summary.precision, cells, f"{summary.behind} of {summary.cells}",
            fmt_num(summary.geomean, ".2f") + ("x" if summary.geomean else ""),
            "-" if worst is None else f"{worst[2]:.2f}x {worst[0]} b{worst[1]}",
            ", ".join(f"{k} {v}" for k, v in summary.choices().items()) or "-"])
    return out


def suite_summary_table(comparison, width=None, wide=False):
    title = (f"suite {comparison.suite}: ours (the class's fastest verified row) over the "
             f"fastest reference row of the class (cuDNN, or cuBLAS's GEMM on 1x1 layers), per "
             f"layer and batch")
    return fitted_table(title, SUMMARY_COLUMNS, suite_summary_rows(comparison), width, wide)


def suite_summary_markdown(comparison) -> str:
    headers = [c.header for c in SUMMARY_COLUMNS]
    lines = [f"## Summary: suite {comparison.suite}", "",
             "Ours (the class's fastest verified row) over the fastest reference row of the class "
             "(cuDNN in either layout, or cuBLAS's GEMM on 1x1 layers with stride 1), per layer "
             "and batch; `tilings`: where our rows' tilings came from.", "",
             "| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i in (0, 4, 5) else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in suite_summary_rows(comparison)]
    return "\n".join(lines) + "\n"


def _layer_title(comparison, first_row) -> str:
    if comparison.suite:
        return f"{first_row.layer}, batch {first_row.batch}: {first_row.shape.brief()}" + (
            f" + {first_row.epilogue}" if first_row.epilogue else "")
    if comparison.model is None:  # a --layer comparison: the shape is its only name
        return f"layer {first_row.shape.brief()}"
    label = first_row.label if first_row.status == "PASS" else first_row.layer
    return f"{comparison.model}: {label}, {first_row.shape.brief()}"


def floor_note(rows) -> list[str]:
    """Which rows' floors count other arithmetic than a direct conv at their class's rate."""
    other = {}
    for row in rows:
        basis = row.floor_basis
        if row.valid and basis and basis != "copy" and basis != row.precision.upper():
            other.setdefault(basis, []).append(row.variant)
    return [f"%floor of {', '.join(dict.fromkeys(names))}: {basis}"
            for basis, names in other.items()]


def compare_tables(comparison, width=None, wide=False) -> list[tuple[Table, list[str]]]:
    """Per layer: the table and the lines below it (why rows FAILed or were skipped)."""
    out = []
    for members in _layers(comparison).values():
        rows, notes = [], floor_note(members)
        for row in members:
            cells = compare_cells(row)
            style = "bold green" if row.best else None
            rows.append([Text(c, style=STATUS_STYLE[row.status] if i == 3 else style)
                         for i, c in enumerate(cells)])
            notes += row_notes(row)
        out.append((fitted_table(_layer_title(comparison, members[0]), COMPARE_COLUMNS, rows,
                                 width, wide), notes))
    return out


def timing_words(policy: dict) -> str:
    """How a record's device rows were timed, from its policy (records before the method
    existed timed one launch on an idle GPU)."""
    if policy.get("method", SINGLE) == QUEUED:
        return ("CUDA events around back-to-back launches queued behind a spin kernel (host "
                "dispatch excluded), per launch")
    return "CUDA events around one launch on an idle GPU (host dispatch included)"


def other_gpus_line(reasons: dict[str, str]) -> str:
    """'Not run on this GPU: a, b: each runs on ...': one line for the variants another GPU
    runs, grouped by reason (each reason names its variant first, as Variant.supports words
    it)."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        by_reason.setdefault(reason.removeprefix(f"'{name}' "), []).append(name)
    return "Not run on this GPU: " + "; ".join(
        f"{', '.join(names)}: {'each ' if len(names) > 1 else ''}{reason}"
        for reason, names in by_reason.items())


def compare_header(comparison) -> str:
    d = comparison.device or {}
    c = comparison.ceilings or {}
    policy = comparison.policy or {}
    cold = "L2 flushed before every run (--cold)" if policy.get("cold") else "warm L2 (default)"
    return (f"{d.get('name', '?')} (CC {d.get('compute_capability', '?')}, CUDA {d.get('cuda_runtime', '?')}, "
            f"CuPy {d.get('cupy', '?')}); ceilings: copy {c.get('copy_gbps', 0):,.0f} GB/s, "
            f"FP32 {c.get('fp32_gflops', 0) / 1e3:,.1f} TFLOP/s, TF32 {c.get('tf32_gflops', 0) / 1e3:,.1f} "
            f"TFLOP/s{_fp16_rate(c)}; timing: {timing_words(policy)}, median until RSE <= "
            f"{100 * policy.get('target_rse', 0.01):g}% or {policy.get('budget_s', 2):g} s per row; "
            f"{cold}. %floor: the roofline floor max(bytes / copy bandwidth, FLOPs issued / that "
            "instruction's rate) over the time, the bytes (and GB/s) of 16-bit tensors for fp16 "
            "and bf16 rows; a direct conv's FLOPs at its class's rate unless "
            "a note under the table names other arithmetic (3xTF32: three TF32 products per FP32 "
            "one; F(2x2): Winograd's GEMM products), so ours stay below 100; cuDNN rows count "
            "direct-conv FLOPs though cuDNN may compute fewer (Winograd, FFT), so theirs can "
            "pass 100. x cuDNN: the fastest reference row of the row's precision class over the "
            "time, named in the cell: cuDNN's NCHW or NHWC row, or on 1x1 layers with stride 1 "
            "cuBLAS's GEMM ('gemm'). The fastest PASS row of each layer: PASS*.")


def _fp16_rate(ceilings: dict) -> str:
    text = f", FP16 {ceilings['fp16_gflops'] / 1e3:,.1f} TFLOP/s" if ceilings.get("fp16_gflops") else ""
    wgmma = [f"{name} {ceilings[key] / 1e3:,.1f}" for name, key in
             (("TF32", "wgmma_tf32_gflops"), ("FP16", "wgmma_fp16_gflops")) if ceilings.get(key)]
    return text + (f"; wgmma {', '.join(wgmma)} TFLOP/s" if wgmma else "")


def interrupted_line(comparison) -> str:
    return (f"Interrupted: {comparison.interrupted}; the rows are what was measured, the rest "
            "never ran.")


def compare_markdown(comparison) -> str:
    headers = [c.header for c in COMPARE_COLUMNS]
    subject = (f"suite {comparison.suite}" if comparison.suite
               else comparison.model or "single layer")
    lines = [f"# convlab compare: {subject}", "", compare_header(comparison), ""]
    if comparison.interrupted:
        lines += [f"**{interrupted_line(comparison)}**", ""]
    if comparison.other_gpus:
        lines += [other_gpus_line(comparison.other_gpus), ""]
    for members in _layers(comparison).values():
        lines += [f"## {_layer_title(comparison, members[0])}", "",
                  "| " + " | ".join(headers) + " |",
                  "|" + "|".join("---" if i in (1, 2, 3) else "---:" for i in range(len(headers))) + "|"]
        notes = [f"- {line}" for line in floor_note(members)]
        for row in members:
            cells = [c.replace("|", "\\|").replace("*", "\\*") for c in compare_cells(row)]
            if row.best:
                cells[4] = f"**{cells[4]}**"
            lines.append("| " + " | ".join(cells) + " |")
            notes += [line.replace("|", "/") for line in row_notes(row, "- ")]
        lines.append("")
        if notes:
            lines += notes + [""]
    if comparison.suite:
        lines.append(suite_summary_markdown(comparison))
    return "\n".join(lines)


def diff_table(deltas, width=None, wide=False) -> RenderableType:
    cols = [Col("variant", "left"), Col("batch"), Col("layer", "left"), Col("old ms"),
            Col("new ms"), Col("ratio"), Col("noise", key=False, priority=1),
            Col("verdict", "left")]
    styles = {"slower": "bold red", "faster": "bold green", "same": None, "new": "yellow",
              "missing": "yellow", "not comparable": "yellow"}
    rows = []
    for d in deltas:
        variant, batch, _, _ = d.key
        rows.append([variant, str(batch), d.label, fmt_num(d.old_ms, ".4f"), fmt_num(d.new_ms, ".4f"),
                     fmt_num(d.ratio, ".3f"), "-" if d.noise is None else f"±{100 * d.noise:.1f}%",
                     Text(d.verdict, style=styles[d.verdict])])
    return fitted_table("against the baseline (ratio = new / old; beyond the noise only)", cols,
                        rows, width, wide)


def ladder_markdown(comparison, batch: int | None = None) -> str:
    """One row per variant, one column pair per layer: time at one batch size and its speed
    relative to the fastest cuDNN row of its precision class, whose layout is named (like
    SGEMM_CUDA's table relative to cuBLAS)."""
    batch = batch or max(comparison.batches)
    rows = [r for r in comparison.rows if r.batch == batch]
    layers = list(dict.fromkeys((r.layer, r.epilogue) for r in rows))
    head = ["variant", "precision"]
    for layer, epilogue in layers:
        suffix = {"tanh-pool": " + tanh + pool", "relu": " + ReLU"}.get(epilogue, "")
        head += [f"{layer}{suffix} ms", "vs cuDNN"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (2 * len(layers))]
    for variant in dict.fromkeys(r.variant for r in rows):
        cells = [variant, next(r.precision for r in rows if r.variant == variant)]
        for layer, epilogue in layers:
            row = next((r for r in rows if (r.variant, r.layer, r.epilogue) ==
                        (variant, layer, epilogue)), None)
            if row is None:
                cells += ["", ""]
            elif not row.valid:
                cells += [row.status, ""]
            else:
                ms = f"{row.median_ms:.3f}"
                cells += [f"**{ms}**" if row.best else ms,
                          cudnn_ratio(row, "x")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
