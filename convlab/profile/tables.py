"""Renderings of a `convlab profile` record: nvprof's tables (GPU activities, API calls), the
warm-up and overhead summary, the batch breakdown, markdown, and the breakdown's plots.

Tables are built by tables.fitted_table, so no cell is ever cut: a kernel name too long for the
console folds onto a second line rather than losing its end, and Min/Max appear when they fit
(or with `wide`).
"""

from __future__ import annotations

from pathlib import Path

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from ..plot import require_pyplot, save_figure
from ..tables import DEFAULT_WIDTH, Col, cell_text, fitted_table, table_width
from .trace import (GPU_CATEGORIES, BatchProfile, NcuTarget, PhaseProfile, Profile, Row, marked,
                    percent_cells)

_UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))


def fmt_time(ns: float) -> str:
    """nvprof's time cells: five significant digits and a unit (1.2345ms, 29.888us, 640.00ns)."""
    if ns <= 0:
        return "0ns"
    for i, (unit, scale) in enumerate(_UNITS):
        if ns >= scale or unit == "ns":
            value = ns / scale
            digits = 4 if value < 10 else 3 if value < 100 else 2
            text = f"{value:.{digits}f}"
            if float(text) >= 1000 and i > 0:  # rounding carried into the next unit up
                value = ns / _UNITS[i - 1][1]
                return f"{value:.4f}{_UNITS[i - 1][0]}"
            return f"{text}{unit}"
    raise AssertionError("unreachable: the last unit takes every value")


def fmt_ms(ns: float) -> str:
    """Milliseconds for the breakdown tables; exactly zero shows as 0 (nothing happened)."""
    if ns == 0:
        return "0"
    ms = ns / 1e6
    return f"{ms:.4f}" if ms < 10 else f"{ms:.2f}"


# --- nvprof's tables ---------------------------------------------------------------------------

def activity_cells(rows: list[Row], threshold: float) -> list[list]:
    """Time(%) (marked with * for the rows that make up `threshold` percent), Time, Calls, Avg,
    Min, Max, Name."""
    cells = []
    for row, pct, mark in zip(rows, percent_cells(rows), marked(rows, threshold)):
        cells.append([("*" if mark else " ") + pct, fmt_time(row.total_ns), str(row.calls),
                      fmt_time(row.avg_ns), fmt_time(row.min_ns), fmt_time(row.max_ns),
                      Text(row.name, style="bold" if mark else None)])
    return cells


def activity_table(title: str, rows: list[Row], threshold: float, width: int | None = None,
                   wide: bool = False, caption: str | None = None) -> RenderableType:
    width = width or DEFAULT_WIDTH
    cells = activity_cells(rows, threshold)
    cols = [Col("Time(%)"), Col("Time"), Col("Calls"), Col("Avg"), Col("Min", key=False),
            Col("Max", key=False), Col("Name", justify="left")]
    natural = [max([len(c.header)] + [cell_len(str(r[i])) for r in cells]) for i, c in enumerate(cols)]
    numbers = [n for c, n in zip(cols[:-1], natural) if c.key or wide]
    if table_width(numbers + [natural[-1]]) > width:
        # The longest name cannot be shown on one line: it folds, and optional columns would
        # only take more of its room.
        cols[-1] = Col("Name", justify="left", wrap=True)
        if not wide:
            dropped = [c.header for c in cols[4:6]]
            cols, cells = cols[:4] + cols[6:], [r[:4] + r[6:] for r in cells]
            return fitted_table(Text(title), cols, cells, width, wide, caption=caption,
                                also_hidden=dropped)
    return fitted_table(Text(title), cols, cells, width, wide, caption=caption)


def _mark_note(threshold: float) -> str:
    return f"* the rows that together make up {threshold:g}% of the time"


def _head_rows(rows: list[Row], threshold: float) -> tuple[list[Row], int]:
    """The marked rows only, and how many were left out (warm-up tables are long)."""
    marks = marked(rows, threshold)
    kept = [r for r, m in zip(rows, marks) if m]
    return kept, len(rows) - len(kept)


def batch_tables(profile: Profile, run: BatchProfile, width: int | None = None,
                 wide: bool = False) -> list[RenderableType]:
    """Steady state in full (nvprof's two tables), then warm-up's marked rows."""
    tables = []
    what = f"{profile.model}, kernel '{profile.kernel}', batch {run.batch}"
    steady = run.phases.get("steady")
    if steady is not None:
        passes = f"{steady.windows} forward pass{'es' if steady.windows != 1 else ''}"
        note = _mark_note(profile.threshold)
        tables.append(activity_table(f"GPU activities: {what} ({passes}, after warm-up)",
                                     steady.gpu, profile.threshold, width, wide, note))
        tables.append(activity_table(f"API calls: {what} ({passes}, after warm-up)",
                                     steady.api, profile.threshold, width, wide, note))
    warm = run.phases.get("warm-up")
    if warm is not None:
        for group, rows in (("GPU activities", warm.gpu), ("API calls", warm.api)):
            kept, left = _head_rows(rows, profile.threshold)
            caption = _mark_note(profile.threshold)
            if left:
                caption += f"; {left} more row{'s' if left != 1 else ''} below that not shown"
            tables.append(activity_table(f"warm-up {group}: {what} (network built, first pass)",
                                         kept, profile.threshold, width, wide, caption))
    return tables


def _phase_text(phase: PhaseProfile | None, what: str) -> str:
    if phase is None:
        return "not traced"
    cats = phase.category_ns()
    parts = [f"{label} {fmt_ms(cats[key])} ms" for key, label in
             (("module", "module load"), ("device_alloc", "device alloc/free"),
              ("pinned", "pinned alloc/free"), ("sync", "sync")) if cats[key]]
    parts.append(f"GPU busy {fmt_ms(phase.gpu_ns)} ms")
    return f"{fmt_ms(phase.wall_ns)} ms: {what}; of it " + ", ".join(parts)


def summary_lines(run: BatchProfile) -> list[tuple[str, str]]:
    """What the tables do not show: the passes, warm-up, teardown and the profiler's overhead."""
    lines = []
    steady = run.phases.get("steady")
    if steady is not None and steady.windows:
        lines.append(("steady state",
                      f"{steady.windows} forward passes traced (host images in, predictions out): "
                      f"{fmt_ms(steady.wall_ns / steady.windows)} ms each on average, GPU busy "
                      f"{fmt_ms(steady.gpu_ns / steady.windows)} ms of it"))
    lines.append(("warm-up", _phase_text(
        run.phases.get("warm-up"),
        "network built (kernels compiled and loaded, device and pinned buffers allocated) "
        "and its first forward pass")))
    lines.append(("teardown", _phase_text(run.phases.get("teardown"),
                                          "network released, memory pools emptied")))
    if run.overhead is not None:
        o = run.overhead
        lines.append(("profiler overhead",
                      f"{o.profiled_ms:.3f} ms per forward pass traced vs {o.unprofiled_ms:.3f} ms "
                      f"untraced: x{o.ratio:.2f} (medians of {o.passes} passes each, wall clock)"))
    return lines


def run_summary(run: BatchProfile) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("")
    for label, text in summary_lines(run):
        table.add_row(label, Text(text))
    return table


# --- the batch breakdown -----------------------------------------------------------------------

STEADY_COLUMNS = (("htod", "HtoD", True), ("conv", "conv", True), ("pool", "pool", True),
                  ("lrn", "LRN", False), ("fc", "FC", True), ("dtoh", "DtoH", True),
                  ("sync", "sync", False), ("other", "other", False),
                  ("device_alloc", "dev alloc", False), ("pinned", "pinned", False))
ONCE_COLUMNS = (("module", "module load", True), ("device_alloc", "dev alloc/free", True),
                ("pinned", "pinned alloc/free", True), ("sync", "sync", False))


def steady_breakdown(profile: Profile) -> tuple[list[Col], list[list]]:
    """One row per batch size, ms per forward pass in each category (mean of the passes)."""
    cols = [Col("batch")]
    for key, label, shown in STEADY_COLUMNS:
        gpu = key in GPU_PARTS
        cols.append(Col(label, key=shown or key == "other", part=gpu and key != "other",
                        rest=key == "other"))
    cols += [Col("GPU busy", key=False), Col("wall")]
    rows = []
    for run in profile.runs:
        steady = run.phases.get("steady")
        if steady is None or not steady.windows:
            continue
        n = steady.windows
        cats = steady.category_ns()
        rows.append([str(run.batch)]
                    + [cats[key] / n / 1e6 if key in GPU_PARTS else fmt_ms(cats[key] / n)
                       for key, _, _ in STEADY_COLUMNS]
                    + [fmt_ms(steady.gpu_ns / n), fmt_ms(steady.wall_ns / n)])
    return cols, rows


def once_breakdown(profile: Profile) -> tuple[list[Col], list[list]]:
    """One row per batch size: what warm-up and teardown cost together, once per batch size."""
    cols = [Col("batch"), Col("wall")] + [Col(label, key=key) for _, label, key in ONCE_COLUMNS]
    cols.append(Col("GPU busy", key=False))
    rows = []
    for run in profile.runs:
        phases = [run.phases[p] for p in ("warm-up", "teardown") if p in run.phases]
        cats = {key: sum(p.category_ns()[key] for p in phases) for key, _, _ in ONCE_COLUMNS}
        rows.append([str(run.batch), fmt_ms(sum(p.wall_ns for p in phases))]
                    + [fmt_ms(cats[key]) for key, _, _ in ONCE_COLUMNS]
                    + [fmt_ms(sum(p.gpu_ns for p in phases))])
    return cols, rows


STEADY_TITLE = "ms per forward pass, steady state (mean of the traced passes)"
GPU_PARTS = ("htod", "conv", "pool", "lrn", "fc", "dtoh", "other")
HOST_PARTS = ("sync", "dev alloc", "pinned")


def steady_note(shown: list[str]) -> str:
    """What the shown columns measure: only those are named."""
    gpu = [label for key, label, _ in STEADY_COLUMNS if key in GPU_PARTS and label in shown]
    host = [h for h in HOST_PARTS if h in shown]
    busy = "; GPU busy is their sum" if "GPU busy" in shown else ""
    parts = [f"GPU columns ({', '.join(gpu)}{busy}) are device time"]
    if host:
        parts.append(f"{', '.join(host)} {'is' if len(host) == 1 else 'are'} host time in "
                     "those CUDA calls")
    parts.append("wall is host to host")
    return "; ".join(parts)


ONCE_TITLE = "ms once per batch size: warm-up (network built, first pass) and teardown"
ONCE_NOTE = "allocation happens here, once: a forward pass allocates nothing"


def breakdown_tables(profile: Profile, width: int | None = None, wide: bool = False) -> list[RenderableType]:
    cols, rows = steady_breakdown(profile)
    once_cols, once_rows = once_breakdown(profile)
    return [fitted_table(Text(STEADY_TITLE), cols, rows, width, wide, caption=steady_note),
            fitted_table(Text(ONCE_TITLE), once_cols, once_rows, width, wide,
                         caption=Text(ONCE_NOTE))]


# --- the whole record --------------------------------------------------------------------------

def header(profile: Profile) -> str:
    device = (profile.device or {}).get("name", "unknown GPU")
    versions = ", ".join(f"{k} {v}" for k, v in profile.versions.items())
    return (f"convlab profile: {profile.model}, kernel '{profile.kernel}', on {device}"
            f"{f' ({versions})' if versions else ''}; CUPTI activity trace")


def render(record: dict, console: Console, wide: bool = False) -> None:
    """Print a profile record: per batch size nvprof's tables and the summary, then with several
    batch sizes the breakdown."""
    profile = Profile.from_dict(record)
    width = console.width
    console.print(Text(header(profile)))
    for run in profile.runs:
        for table in batch_tables(profile, run, width, wide):
            console.print(table)
        console.print(run_summary(run))
    if len(profile.runs) > 1:
        for table in breakdown_tables(profile, width, wide):
            console.print(table)


def _md_table(headers: list[str], rows: list[list[str]], left: set[int] = frozenset()) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i in left else "---:" for i in range(len(headers))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return lines + [""]


def _md_activities(rows: list[Row], threshold: float) -> list[str]:
    """Names as code (a template's <...> would be taken for HTML), marked rows in bold."""
    cells = []
    for r in activity_cells(rows, threshold):
        name = f"`{r[6].plain}`"
        mark = r[0].startswith("*")
        cells.append([("\\" + r[0]) if mark else r[0].strip()] + r[1:6]
                     + [f"**{name}**" if mark else name])
    return _md_table(["Time(%)", "Time", "Calls", "Avg", "Min", "Max", "Name"], cells, {6})


def markdown(record: dict) -> str:
    profile = Profile.from_dict(record)
    lines = [f"# convlab profile: {profile.model}, kernel {profile.kernel}", "", header(profile), ""]
    if profile.command:
        lines += [f"`{profile.command}`", ""]
    lines += [f"Rows in bold (Time(%) marked \\*) together make up {profile.threshold:g}% of the "
              "time.", ""]
    for run in profile.runs:
        lines += [f"## batch {run.batch}", ""]
        for phase_name, title in (("steady", f"after warm-up, {run.passes} forward passes"),
                                  ("warm-up", "warm-up: network built and its first forward pass"),
                                  ("teardown", "teardown: network released, memory pools emptied")):
            phase = run.phases.get(phase_name)
            if phase is None:
                continue
            lines += [f"### GPU activities, {title}", ""] + _md_activities(phase.gpu, profile.threshold)
            lines += [f"### API calls, {title}", ""] + _md_activities(phase.api, profile.threshold)
        lines += [f"- {label}: {text}" for label, text in summary_lines(run)] + [""]
    if len(profile.runs) > 1:
        steady, once = steady_breakdown(profile), once_breakdown(profile)
        for title, note, (cols, rows) in (
                (STEADY_TITLE, steady_note([c.header for c in steady[0]]), steady),
                (ONCE_TITLE, ONCE_NOTE, once)):
            cells = [[cell_text(v, c) for v, c in zip(r, cols)] for r in rows]
            lines += [f"## {title}", "", note + ".", ""] + _md_table([c.header for c in cols], cells)
    return "\n".join(lines)


# --- plots ---------------------------------------------------------------------------------------

def plot(record: dict, path: Path) -> Path:
    """Two figures of the batch breakdown: time against batch size (log-log), and where a
    forward pass's wall time goes at each batch size (stacked shares)."""
    plt = require_pyplot()
    profile = Profile.from_dict(record)
    runs = [r for r in profile.runs if r.phases.get("steady") and r.phases["steady"].windows]
    batches = [r.batch for r in runs]
    per_pass = [r.phases["steady"] for r in runs]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
    wall = [p.wall_ns / p.windows / 1e6 for p in per_pass]
    busy = [p.gpu_ns / p.windows / 1e6 for p in per_pass]
    once = [sum(r.phases[q].wall_ns for q in ("warm-up", "teardown") if q in r.phases) / 1e6
            for r in runs]
    ax.plot(batches, wall, "o-", label="forward pass, wall (host images in, predictions out)")
    ax.plot(batches, busy, "s--", label="forward pass, GPU busy")
    ax.plot(batches, once, "^:", label="once per batch size: warm-up + teardown")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size (images)")
    ax.set_ylabel("time (ms)")
    ax.set_title("total time against batch size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)

    keys = [k for k in GPU_CATEGORIES]
    labels = [GPU_CATEGORIES[k] for k in keys] + ["host: launches, sync, Python (GPU idle)"]
    shares = []
    for p in per_pass:
        cats = p.category_ns()
        values = [cats[k] for k in keys]
        values.append(max(0, p.wall_ns - p.gpu_ns))
        total = max(sum(values), 1)
        shares.append([100 * v / total for v in values])
    positions = range(len(batches))
    bottom = [0.0] * len(batches)
    colours = plt.cm.tab10
    for i, label in enumerate(labels):
        heights = [s[i] for s in shares]
        bx.bar(positions, heights, bottom=bottom, label=label,
               color="lightgray" if i == len(labels) - 1 else colours(i))
        bottom = [b + h for b, h in zip(bottom, heights)]
    bx.set_xticks(list(positions), [str(b) for b in batches])
    bx.set_xlabel("batch size (images)")
    bx.set_ylabel("share of a forward pass's wall time (%)")
    bx.set_title("where a forward pass's time goes")
    bx.set_ylim(0, 100)
    bx.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    device = (profile.device or {}).get("name", "unknown GPU")
    fig.suptitle(f"convlab profile: {profile.model}, kernel '{profile.kernel}' on {device}")

    return save_figure(fig, path)


# --- ncu -----------------------------------------------------------------------------------------

def ncu_lines(targets: list[NcuTarget]) -> list[str]:
    """Each launch of the layer's step: what it is, and the ncu command that profiles it."""
    lines = []
    for t in targets:
        lines += [f"{t.step}: {t.name} (function {t.symbol}), launch {t.skip + 1} of that function "
                  f"in a forward pass", f"  {t.command}"]
    lines.append("--launch-skip counts the function's launches before this one in one forward "
                 "pass; convlab run's first forward pass is the first to launch each layer's "
                 "kernel, so ncu profiles this layer's launch in that pass.")
    if any(not t.ours for t in targets):
        lines.append("A library kernel (cuDNN, cuBLAS) may also run while the library picks an "
                     "algorithm on its first call; if ncu's report shows another layer's launch, "
                     "raise ncu's --launch-skip.")
    return lines
