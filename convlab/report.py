"""Rich renderings of convlab's records: variants, models, device, and run results."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from .lab import RunResult


def fmt_ms(ms: float) -> str:
    return f"{ms:.4f}" if ms < 10 else f"{ms:.2f}"


def fmt_err(err: float) -> str:
    return "-" if err != err else ("inf" if err == float("inf") else f"{err:.1e}")


def status_text(passed: bool, reason: str = "") -> Text:
    if passed:
        return Text("PASS", style="bold green")
    return Text("FAIL" + (f": {reason}" if reason else ""), style="bold red")


def variants_table(variants) -> Table:
    table = Table(title="convlab variants (ladder order)")
    table.add_column("name", style="bold cyan")
    table.add_column("precision")
    table.add_column("runs on")
    table.add_column("summary")
    for v in variants:
        where = "GPU" if v.on_gpu else "CPU"
        if v.epilogues:
            where += " (fuses conv+tanh+pool)" if v.fuses_in_network else ""
        table.add_row(v.name, v.precision, where, v.summary)
    return table


def models_table(rows) -> Table:
    """rows: (spec, weights or None, error message or None)."""
    table = Table(title="convlab models")
    table.add_column("name", style="bold cyan")
    table.add_column("input")
    table.add_column("layers")
    table.add_column("expected accuracy (batch 10 / 100 / 1000 / 10000)")
    table.add_column("course reported")
    for spec, weights, error in rows:
        if weights is not None:
            acc = weights.expected_accuracy
            expected = " / ".join(f"{acc[n]:.4f}" for n in sorted(acc))
        else:
            expected = Text(error or "no weights", style="red")
        table.add_row(spec.name, f"1x{spec.input_size}x{spec.input_size}", spec.describe(),
                      expected, f"{spec.course_accuracy:.4f}")
    return table


def device_table(info: dict, ceilings=None) -> Table:
    table = Table(title="GPU", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    for key, label in (("name", "device"), ("compute_capability", "compute capability"),
                       ("multiprocessors", "multiprocessors"), ("memory_gib", "memory (GiB)"),
                       ("l2_mib", "L2 (MiB)"), ("driver", "CUDA driver API"),
                       ("cuda_runtime", "CUDA runtime"), ("cupy", "CuPy")):
        table.add_row(label, str(info[key]))
    if ceilings is not None:
        table.add_row("copy bandwidth", f"{ceilings.copy_gbps:,.0f} GB/s (device-to-device, read+write)")
        table.add_row("FP32 rate", f"{ceilings.fp32_gflops / 1e3:,.1f} TFLOP/s (cuBLAS SGEMM 8192^3)")
        table.add_row("TF32 rate", f"{ceilings.tf32_gflops / 1e3:,.1f} TFLOP/s (mma.sync m16n8k8 peak)")
        table.add_row("ceilings measured", ceilings.measured_at)
    return table


def run_table(result: RunResult) -> Table:
    table = Table(title=f"{result.model}, kernel '{result.kernel}' ({result.precision}), "
                        f"batch {result.batch}")
    table.add_column("layer", style="bold")
    table.add_column("CxHxW->MxHoxWo KxK")
    for col in ("Op Time ms", "min", "IQR", "runs", "GFLOP/s", "GB/s", "rel err"):
        table.add_column(col, justify="right")
    table.add_column("check")
    for layer in result.layers:
        t = layer.timing
        ok = layer.check.passed
        style = None if ok else "dim"
        table.add_row(layer.label, layer.shape.brief(),
                      Text(fmt_ms(t.median_ms), style=style), Text(fmt_ms(t.min_ms), style=style),
                      f"{t.spread_pct:.0f}%", str(t.n),
                      Text(f"{layer.gflops:,.0f}", style=style), Text(f"{layer.gbps:,.0f}", style=style),
                      fmt_err(layer.check.max_rel_error), status_text(ok))
    return table


def failure_lines(result: RunResult) -> list[str]:
    return [f"{layer.label}: {layer.check.reason}" for layer in result.layers if not layer.check.passed]


def run_summary(result: RunResult) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column("", style="bold")
    table.add_column("")
    acc = Text(f"{result.accuracy:.4f}")
    acc.append(f"  (CPU reference {result.expected_accuracy:.4f}; "
               f"{result.predictions_differ} of {result.batch} predictions differ)",
               style="green" if result.predictions_differ == 0 else "yellow")
    table.add_row("accuracy", acc)
    table.add_row("verdict", status_text(result.passed, "" if result.passed else
                  "a layer failed verification or predictions differ from the CPU reference"))
    if result.device is None:
        table.add_row("compile time", "none (the cpu variant is NumPy)")
    else:
        table.add_row("compile time", f"{result.compile_s:.2f} s (NVRTC + module load; CuPy caches "
                                      "compiled kernels on disk, so repeats are fast)")
    table.add_row("end-to-end", f"{result.end_to_end_s * 1e3:.1f} ms (host images in, predictions out)")
    table.add_row("wall time", f"{result.wall_s:.2f} s (whole run)")
    if result.device:
        table.add_row("device", result.device["name"])
    for note in result.notes:
        table.add_row("note", Text(note))
    return table


# --- convlab compare -------------------------------------------------------------------------

COMPARE_COLUMNS = ("batch", "variant", "prec", "status", "Op Time ms", "min ms", "RSE", "runs",
                   "GFLOP/s", "GB/s", "% floor", "x naive", "x cuDNN", "rel err", "accuracy")


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def compare_cells(row) -> list[str]:
    """A row as text cells; a row that did not PASS shows no speed at all."""
    t = row.timing if row.valid else None
    acc = "-" if row.accuracy is None else f"{row.accuracy:.4f}"
    if row.predictions_differ:
        acc += f" ({row.predictions_differ} differ)"
    status = row.status if row.status == "PASS" else f"{row.status}: {row.reason}"
    return [
        str(row.batch), row.variant, row.precision, status,
        _num(t and t.median_ms, ".4f"), _num(t and t.min_ms, ".4f"),
        "-" if t is None else f"{100 * t.rse:.1f}%", "-" if t is None else str(t.n),
        _num(row.gflops, ",.0f"), _num(row.gbps, ",.0f"), _num(row.pct_floor, ".0f"),
        _num(row.speedup_naive, ".2f"), _num(row.speedup_cudnn, ".2f"),
        "-" if row.max_rel_error is None or not row.valid else fmt_err(row.max_rel_error), acc,
    ]


def _layers(comparison):
    seen = {}
    for row in comparison.rows:
        seen.setdefault((row.layer, row.epilogue), row)
    return seen


def _layer_title(comparison, first_row) -> str:
    what = comparison.model or "layer"
    ceil = comparison.ceilings
    title = f"{what}: {first_row.label}, {first_row.shape.brief()}"
    if ceil:
        title += f"  [floor: max(bytes / {ceil['copy_gbps']:,.0f} GB/s, FLOPs / rate)]"
    return title


def compare_tables(comparison) -> list[Table]:
    tables = []
    for (layer, epilogue), first in _layers(comparison).items():
        table = Table(title=_layer_title(comparison, first))
        for col in COMPARE_COLUMNS:
            table.add_column(col, justify="left" if col in ("variant", "prec", "status") else "right")
        for row in comparison.rows:
            if (row.layer, row.epilogue) != (layer, epilogue):
                continue
            cells = compare_cells(row)
            style = "bold green" if row.best else None
            status_style = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}[row.status]
            table.add_row(*[Text(c, style=status_style if i == 3 else style)
                            for i, c in enumerate(cells)])
        tables.append(table)
    return tables


def compare_header(comparison) -> str:
    d = comparison.device or {}
    c = comparison.ceilings or {}
    policy = comparison.policy or {}
    cold = "L2 flushed before every run (--cold)" if policy.get("cold") else "warm L2 (default)"
    return (f"{d.get('name', '?')} (CC {d.get('compute_capability', '?')}, CUDA {d.get('cuda_runtime', '?')}, "
            f"CuPy {d.get('cupy', '?')}); ceilings: copy {c.get('copy_gbps', 0):,.0f} GB/s, "
            f"FP32 {c.get('fp32_gflops', 0) / 1e3:,.1f} TFLOP/s, TF32 {c.get('tf32_gflops', 0) / 1e3:,.1f} "
            f"TFLOP/s; timing: CUDA events, median until RSE <= {100 * policy.get('target_rse', 0.01):g}% "
            f"or {policy.get('budget_s', 2):g} s per row; {cold}. Best PASS time per layer in bold.")


def compare_markdown(comparison) -> str:
    lines = [f"# convlab compare: {comparison.model or 'single layer'}", "", compare_header(comparison), ""]
    for (layer, epilogue), first in _layers(comparison).items():
        lines += [f"## {_layer_title(comparison, first)}", "",
                  "| " + " | ".join(COMPARE_COLUMNS) + " |",
                  "|" + "|".join("---" if i in (1, 2, 3) else "---:" for i in range(len(COMPARE_COLUMNS))) + "|"]
        for row in comparison.rows:
            if (row.layer, row.epilogue) != (layer, epilogue):
                continue
            cells = [c.replace("|", "\\|") for c in compare_cells(row)]
            if row.best:
                cells[4] = f"**{cells[4]}**"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def diff_table(deltas) -> Table:
    table = Table(title="against the baseline (ratio = new / old; beyond the noise only)")
    for col in ("variant", "batch", "layer", "old ms", "new ms", "ratio", "noise", "verdict"):
        table.add_column(col, justify="right" if col in ("batch", "old ms", "new ms", "ratio", "noise") else "left")
    styles = {"slower": "bold red", "faster": "bold green", "same": None, "new": "yellow",
              "missing": "yellow", "not comparable": "yellow"}
    for d in deltas:
        variant, batch, _, _ = d.key
        table.add_row(variant, str(batch), d.label, _num(d.old_ms, ".4f"), _num(d.new_ms, ".4f"),
                      _num(d.ratio, ".3f"), "-" if d.noise is None else f"±{100 * d.noise:.1f}%",
                      Text(d.verdict, style=styles[d.verdict]))
    return table


def ladder_markdown(comparison, batch: int | None = None) -> str:
    """One row per variant, one column pair per layer: time at one batch size and its speed
    relative to cuDNN fp32 (like SGEMM_CUDA's table relative to cuBLAS)."""
    batch = batch or max(comparison.batches)
    rows = [r for r in comparison.rows if r.batch == batch]
    layers = list(dict.fromkeys((r.layer, r.epilogue) for r in rows))
    head = ["variant", "precision"]
    for layer, epilogue in layers:
        head += [f"{layer}{' + tanh + pool' if epilogue else ''} ms", "vs cuDNN"]
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
                          "-" if row.speedup_cudnn is None else f"{row.speedup_cudnn:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
