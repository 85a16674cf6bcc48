"""Tables that fit the terminal: the engine every table of convlab is built with.

`fitted_table` never truncates a cell: it shows the key columns whole, adds the optional ones
(most important first) while the table still fits the console width, and shows them all with
`wide`. Rich assumes 80 columns when output goes to a pipe or a file, so the key columns of
every table are chosen to fit 80. Under a table that left columns out, a line names them and
--wide; notes speak only of shown columns, and a breakdown folds its hidden parts into its
catch-all so the shown ones still add up. It knows rich and nothing of convlab's records, so
any layer may render with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

DEFAULT_WIDTH = 80
GAP = 3  # columns between two cells: one space of padding each side of an invisible rule


@dataclass
class Col:
    header: str
    justify: str = "right"
    key: bool = True  # always shown; optional columns appear when they fit, or with --wide
    style: str | None = None
    wrap: bool = False  # prose columns may wrap at spaces (never cut); numbers and names never
    wrap_width: int = 24  # a prose column is never made narrower than this (or its header)
    priority: int = 0  # among optional columns, lower numbers are added first
    note: str = ""  # a footnote about this column: printed under the table only when it is shown
    part: bool = False  # one term of a breakdown (cells are ms); hidden, it folds into `rest`
    rest: bool = False  # the breakdown's catch-all: shows what the hidden parts add (cells ms)


def _cell_width(cell) -> int:
    text = cell if isinstance(cell, Text) else Text(str(cell))
    return max((Text(line).cell_len for line in text.plain.split("\n")), default=0)


def table_width(widths: list[int]) -> int:
    return sum(widths) + GAP * (len(widths) - 1) if widths else 0


def cell_text(value, col: Col):
    if isinstance(value, Text):
        return value
    if (col.part or col.rest) and isinstance(value, (int, float)):
        return fmt_ms(value)
    return str(value)


def _natural(cols: list[Col], rows: list[list]) -> list[int]:
    return [max([len(c.header)] + [_cell_width(cell_text(r[i], c)) for r in rows])
            for i, c in enumerate(cols)]


def choose_columns(cols: list[Col], rows: list[list], width: int, wide: bool) -> list[int]:
    """Indices of the columns to show: key columns always, optional ones by priority while the
    table still fits `width` (each column at its narrowest: prose wrapped, numbers whole)."""
    natural = _natural(cols, rows)
    floor = [min(n, max(len(c.header), c.wrap_width)) if c.wrap else n
             for c, n in zip(cols, natural)]
    shown = [i for i, c in enumerate(cols) if c.key or wide]
    if not wide:
        for _, i in sorted((c.priority, i) for i, c in enumerate(cols) if not c.key):
            if table_width([floor[j] for j in shown + [i]]) <= width:
                shown.append(i)
    return sorted(shown)


def hidden_line(headers: list[str]) -> str:
    n = len(headers)
    return (f"{n} column{'s' if n != 1 else ''} hidden: {', '.join(headers)}; --wide shows "
            f"{'them' if n != 1 else 'it'}")


def fitted_table(title: str | None, cols: list[Col], rows: list[list], width: int | None = None,
                 wide: bool = False, caption=None, also_hidden: list[str] = (),
                 **options) -> RenderableType:
    """A table of the columns that fit `width` (key columns always, optional ones by priority
    while they fit; all of them with `wide`), each at least as wide as its widest cell.

    Under it: `caption` (text, or a function of the shown headers that writes it), then the
    notes of the shown columns, then which columns are hidden.
    The hidden parts of a breakdown are added into its `rest` column, so the shown columns
    still add up to the total."""
    width = width or DEFAULT_WIDTH
    shown = choose_columns(cols, rows, width, wide)
    folded = [i for i, c in enumerate(cols) if c.part and i not in shown]
    rest = next((i for i in shown if cols[i].rest), None)
    if folded and rest is not None:
        rows = [list(r) for r in rows]
        for r in rows:
            r[rest] = r[rest] + sum(r[i] for i in folded)
    if callable(caption):
        caption = caption([cols[i].header for i in shown])
    lines = [caption.plain if isinstance(caption, Text) else caption] if caption else []
    lines += [cols[i].note for i in shown if cols[i].note]
    if folded and rest is not None:
        lines.append(f"{cols[rest].header} includes the hidden "
                     f"{', '.join(cols[i].header for i in folded)}")
    hidden = list(also_hidden) + [cols[i].header for i in range(len(cols)) if i not in shown]
    if hidden:
        lines.append(hidden_line(hidden))
    natural = _natural(cols, rows)
    options.setdefault("box", box.SIMPLE_HEAD)
    options.setdefault("show_edge", False)
    options.setdefault("pad_edge", False)
    table = Table(title=title, **options)
    for i in shown:
        c = cols[i]
        if c.wrap:
            table.add_column(c.header, justify=c.justify, style=c.style, overflow="fold",
                             min_width=min(natural[i], max(len(c.header), c.wrap_width)))
        else:
            table.add_column(c.header, justify=c.justify, style=c.style, no_wrap=True,
                             overflow="fold", min_width=natural[i])
    for r in rows:
        table.add_row(*[cell_text(r[i], cols[i]) for i in shown])
    # Below the table, not its caption: a caption wraps at the table's width, mid-word when the
    # table is narrow; lines of their own wrap at the console's, between words.
    return Group(table, Text("\n".join(lines))) if lines else table


def fmt_ms(ms: float) -> str:
    return f"{ms:.4f}" if ms < 10 else f"{ms:.2f}"


def fmt_err(err: float) -> str:
    return "-" if err != err else ("inf" if err == float("inf") else f"{err:.1e}")


def fmt_num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def status_text(passed: bool) -> Text:
    return Text("PASS", style="bold green") if passed else Text("FAIL", style="bold red")


STATUS_STYLE = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
