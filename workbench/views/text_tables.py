"""Tables of formatted text that every surface places: the CLI prints them with rich, the HTML views embed
them as HTML tables. A `TextTable` carries the decisions (columns, their alignment, the formatted cells, which
cells read as good or bad news), so a surface only renders it. A report is a sequence of `Block`s: paragraphs
(a str, or a tuple of `Cell`s where parts stand out) and tables, in order.
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from bokeh.models import LayoutDOM

Tone = Literal["good", "bad", "strong"]
TONE_STYLES: dict[str, str] = {"good": "green", "bad": "red", "strong": "bold"}
"""The rich style of each tone."""
TONE_CSS: dict[str, str] = {"good": "color:green;", "bad": "color:red;", "strong": "font-weight:bold;"}
"""The CSS of each tone."""


@dataclass(frozen=True)
class Cell:
    """One formatted cell (or part of a paragraph); `tone` marks good or bad news (an ok status, a failure, a
    scenario that does not fit) or a name that should stand out."""

    text: str
    tone: Tone | None = None


Paragraph = tuple[Cell, ...]
"""Text whose parts differ in tone: a line of a report, or a table cell."""


@dataclass(frozen=True)
class TextTable:
    """A titled table of formatted cells (a cell whose parts differ in tone is a `Paragraph`); the columns named
    in `left` are aligned left (text), the others right (numbers). Without `show_header` it is a key-value list."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell | Paragraph, ...], ...]
    left: frozenset[str] = frozenset()
    show_header: bool = True

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: a row of {len(row)} cells for {len(self.columns)} columns")


Block = str | Paragraph | TextTable
"""A part of a text report: a paragraph or a table."""


def format_number(value: Any, suffix: str = "") -> str:
    """A figure for a table: three significant digits below 1000, thousands separated above ("12.3", "4,096"),
    "-" when missing; strings pass through."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.3g}{suffix}" if abs(value) < 999.5 else f"{value:,.0f}{suffix}"


DURATION_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
"""Units of a duration, largest first, with their size in ns."""


def format_duration(ns: Any) -> str:
    """A duration given in ns in the unit that suits it, three significant digits: "850 ns", "12.3 µs",
    "80.8 ms", "1.23 s" (seconds past 1000 with separators: "4,096 s"); "-" when missing (None or NaN)."""
    if ns is None or (isinstance(ns, numbers.Real) and ns != ns):
        return "-"
    value = float(ns)
    size, unit = next(((size, unit) for size, unit in DURATION_UNITS if abs(value) / size >= 0.9995),
                      DURATION_UNITS[-1])
    return format_number(value / size, f" {unit}")


def format_count(value: Any) -> str:
    """A count as an integer with separators ("12,345"), whatever its type (3.0 reads "3"); "-" when missing."""
    if value is None or (isinstance(value, numbers.Real) and value != value):
        return "-"
    return f"{round(float(value)):,}"


def cells(*values: Any) -> tuple[Cell | Paragraph, ...]:
    """A row of cells: `Cell`s and `Paragraph`s kept, numbers through `format_number`, anything else as text."""
    return tuple(v if isinstance(v, Cell | tuple) else Cell(format_number(v) if isinstance(v, numbers.Real) else
                                                            "-" if v is None else str(v)) for v in values)


def status_cell(status: str) -> Cell:
    """A run's status: "ok" as good news, anything else as bad."""
    return Cell(status, "good" if status == "ok" else "bad")


def html_table(table: TextTable) -> str:
    """The table as an HTML fragment, every text escaped."""
    def cell_html(tag: str, column: str, cell: Cell | Paragraph) -> str:
        align = "left" if column in table.left else "right"
        tone = TONE_CSS[cell.tone] if isinstance(cell, Cell) and cell.tone else ""
        text = html.escape(cell.text) if isinstance(cell, Cell) else paragraph_html(cell)
        return f'<{tag} style="text-align:{align};{tone}padding:2px 8px">{text}</{tag}>'

    head = ("<tr>" + "".join(cell_html("th", c, Cell(c)) for c in table.columns) + "</tr>") if table.show_header else ""
    body = "".join("<tr>" + "".join(cell_html("td", c, cell) for c, cell in zip(table.columns, row, strict=True))
                   + "</tr>" for row in table.rows)
    caption = f'<caption style="text-align:left;font-weight:bold">{html.escape(table.title)}</caption>'
    return f'<table style="border-collapse:collapse;font-size:12px">{caption}{head}{body}</table>'


def paragraph_html(paragraph: str | Paragraph) -> str:
    """A paragraph as an HTML fragment, every text escaped."""
    if isinstance(paragraph, str):
        return html.escape(paragraph)
    return "".join(f'<span style="{TONE_CSS[part.tone]}">{html.escape(part.text)}</span>' if part.tone
                   else html.escape(part.text) for part in paragraph)


def blocks_view(blocks: Sequence[Block], *, width: int = 1100) -> LayoutDOM:
    """The blocks as a Bokeh column: paragraphs as text, tables as HTML tables."""
    from bokeh.layouts import column
    from bokeh.models import Div

    return column(*(Div(text=html_table(block) if isinstance(block, TextTable) else paragraph_html(block),
                        width=width) for block in blocks))
