"""Tables, markdown and the timeline plot of a streamed run (`convlab run --images`)."""

from __future__ import annotations

from pathlib import Path

from rich.console import RenderableType
from rich.text import Text

from .plot import require_pyplot, save_figure
from .tables import Col, fitted_table, fmt_ms, fmt_num, status_text

BATCH_ROWS_SHOWN = 10  # per-batch rows in a terminal table: the first ones and the last two
LANES = (("copy", "HtoD copy"), ("forward", "pass"), ("back", "DtoH copy"))


def _row_passed(record, row: dict) -> bool:
    return row["float32_differ"] == 0 and (record.precision != "fp32"
                                           or row.get("reference_differ", 0) == 0)


def _torch_row(record, batch: int) -> dict | None:
    return next((t for t in record.torch_rows if t["batch"] == batch and "error" not in t), None)


def summary_table(record, width=None, wide=False) -> RenderableType:
    cols = [Col("batch", style="bold"), Col("images/s"), Col("ms/batch"),
            Col("copy ms", note="copy ms, pass ms: one batch's HtoD copy and its pass (ingest, "
                                "network, top-1), each timed alone"),
            Col("pass ms"), Col("ratio", note="ratio: ms/batch in the stream over max(copy, "
                                              "pass): 1.00 is perfect overlap"),
            Col("vs PyTorch", key=False, priority=1,
                note="vs PyTorch: its stream's ms/batch over ours (above 1: ours is faster)"),
            Col("MB/batch", key=False, priority=3),
            Col("fill ms", key=False, priority=4,
                note="fill ms: the host gathering a batch that wraps the end of the "
                     "pinned dataset into a pinned buffer (median; 0: none did)"),
            Col("accuracy", key=False, priority=2), Col("check", "left")]
    rows = []
    for r in record.rows:
        torch_row = _torch_row(record, r["batch"])
        speedup = torch_row["batch_ms"] / r["batch_ms"] if torch_row else None
        rows.append([str(r["batch"]), f"{r['images_per_s']:,.0f}", fmt_ms(r["batch_ms"]),
                     fmt_ms(r["copy_ms"]), fmt_ms(r["forward_ms"]), f"{r['ratio']:.2f}",
                     fmt_num(speedup, ".2f"), f"{r['upload_bytes'] / 1e6:.1f}",
                     fmt_ms(r["fill_ms"]), fmt_num(r.get("accuracy"), ".4f"),
                     status_text(_row_passed(record, r))])
    title = (f"{record.model}, kernel '{record.kernel}' ({record.precision}): "
             f"{record.images:,} images streamed, {record.upload} upload")
    return fitted_table(title, cols, rows, width, wide)


def torch_table(record, width=None, wide=False) -> RenderableType | None:
    if not record.torch_rows:
        return None
    cols = [Col("batch", style="bold"), Col("PyTorch", "left", wrap=True), Col("images/s"),
            Col("ms/batch"), Col("copy ms", key=False, priority=1),
            Col("pass ms", key=False, priority=1), Col("ratio", key=False, priority=2),
            Col("top-1 differ", key=False, priority=3)]
    rows = []
    for t in record.torch_rows:
        if "error" in t:
            rows.append([str(t["batch"]), t["error"], "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([str(t["batch"]), t["label"], f"{t['images_per_s']:,.0f}",
                     fmt_ms(t["batch_ms"]), fmt_ms(t["copy_ms"]), fmt_ms(t["forward_ms"]),
                     f"{t['ratio']:.2f}", f"{t['differ']} (of the first batch)"])
    return fitted_table("The same stream in PyTorch (its fastest form on the first batch)",
                        cols, rows, width, wide)


def _shown(timeline: list[dict]) -> list[dict | None]:
    """The first batches and the last two, None standing for those left out between."""
    if len(timeline) <= BATCH_ROWS_SHOWN:
        return list(timeline)
    return timeline[:BATCH_ROWS_SHOWN - 2] + [None] + timeline[-2:]


def _batch_cells(b: dict | None) -> list[str]:
    if b is None:
        return ["..."] * 8
    return [str(b["index"]), str(b["slot"]), fmt_ms(b["fill_ms"]), f"{b['copy'][0]:.3f}",
            fmt_ms(b["copy_ms"]), f"{b['forward'][0]:.3f}", fmt_ms(b["forward_ms"]),
            fmt_ms(b["back_ms"])]


BATCH_COLUMNS = [Col("batch #", style="bold"), Col("slot", key=False, priority=2),
                 Col("fill ms", key=False, priority=1), Col("copy at"), Col("copy ms"),
                 Col("pass at"), Col("pass ms"), Col("back ms")]


def batches_table(record, row: dict, width=None, wide=False) -> RenderableType:
    """Issue 10's per-batch view of one stream: where each batch's copy and pass ran (ms from
    the stream's start, CUDA events) and how long each took there."""
    rows = [_batch_cells(b) for b in _shown(row["timeline"])]
    title = (f"batch {row['batch']}: per-batch profile of {len(row['timeline'])} batches "
             "('at': ms from the start)")
    return fitted_table(title, BATCH_COLUMNS, rows, width, wide)


def check_lines(record) -> list[str]:
    lines = []
    for r in record.rows:
        words = [f"batch {r['batch']}: the {record.upload} stream's first batch gives "
                 f"{'the same' if r['float32_differ'] == 0 else 'DIFFERENT'} predictions as the "
                 f"float32 path ({r['float32_differ']} differ, max |p8 - p32| "
                 f"{r['float32_max_prob_diff']:.1e})"]
        if "reference_differ" in r:
            words.append(f"{r['reference_differ']} of {record.images:,} differ from the float64 "
                         "reference")
        lines.append("; ".join(words))
    return lines


def fill_words(record) -> str:
    return (f"held in pinned memory, batches copied straight from it ({record.workers} host "
            "threads gather one that wraps its end)")


def render(out, record, wide: bool) -> None:
    out.print(summary_table(record, out.width, wide))
    extra = torch_table(record, out.width, wide)
    if extra is not None:
        out.print(extra)
    if record.torch_note:
        out.print(f"PyTorch: {record.torch_note}")
    for row in record.rows:
        out.print(batches_table(record, row, out.width, wide))
    for line in check_lines(record):
        out.print(Text(line))
    out.print(Text(f"images: {record.source}; {fill_words(record)}"))


def markdown(record) -> str:
    device = (record.device or {}).get("name", "unknown GPU")
    lines = [f"# convlab stream: {record.model}, kernel {record.kernel} ({record.precision})", "",
             f"{device}; {record.images:,} images ({record.source}), {record.upload} upload; "
             f"{fill_words(record)}; `{record.command}`", "",
             "| batch | images/s | ms/batch | copy ms | pass ms | ratio | PyTorch ms/batch | "
             "accuracy | check |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in record.rows:
        torch_row = _torch_row(record, r["batch"])
        lines.append(
            f"| {r['batch']} | {r['images_per_s']:,.0f} | {r['batch_ms']:.3f} | "
            f"{r['copy_ms']:.3f} | {r['forward_ms']:.3f} | {r['ratio']:.2f} | "
            f"{fmt_num(torch_row['batch_ms'] if torch_row else None, '.3f')} "
            f"({torch_row['label'] if torch_row else '-'}) | "
            f"{fmt_num(r.get('accuracy'), '.4f')} | "
            f"{'PASS' if _row_passed(record, r) else 'FAIL'} |")
    lines += ["", "copy ms and pass ms are each timed alone; ratio is ms/batch in the stream "
                  "over max(copy, pass).", ""]
    lines += [f"- {line}" for line in check_lines(record)] + [""]
    for r in record.rows:
        lines += [f"## batch {r['batch']}: per batch (ms from the stream's start)", "",
                  "| batch # | slot | fill ms | copy at | copy ms | pass at | pass ms | back ms |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += ["| " + " | ".join(_batch_cells(b)) + " |" for b in r["timeline"]] + [""]
    return "\n".join(lines)


def plot_timeline(record, path: Path) -> Path:
    """One panel per batch size: the HtoD copies, passes and DtoH copies of every batch as bars
    on their stream's lane, coloured by buffer slot."""
    plt = require_pyplot()
    fig, axes = plt.subplots(len(record.rows), 1, figsize=(12, 2.2 * len(record.rows) + 0.6),
                             squeeze=False)
    for ax, r in zip(axes[:, 0], record.rows):
        for lane, (key, label) in enumerate(LANES):
            for b in r["timeline"]:
                start, end = b[key]
                ax.broken_barh([(start, max(end - start, 1e-3))], (lane - 0.4, 0.8),
                               color=plt.cm.tab10(b["slot"] % 10), edgecolor="black",
                               linewidth=0.3)
        ax.set_yticks(range(len(LANES)), [label for _, label in LANES])
        ax.set_xlabel("ms from the stream's start")
        ax.set_title(f"batch {r['batch']}: {r['images_per_s']:,.0f} images/s, "
                     f"{r['ratio']:.2f}x max(copy, pass) per batch")
        ax.grid(True, axis="x", alpha=0.3)
    device = (record.device or {}).get("name", "unknown GPU")
    fig.suptitle(f"convlab stream: {record.model}, {record.kernel} on {device} "
                 "(colour: buffer slot)")
    return save_figure(fig, path)
