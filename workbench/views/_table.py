"""The views' one way to build a Bokeh DataTable from a DataFrame, so every table sorts, formats text cells
and sizes its columns alike."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from bokeh.models import (
    ColumnDataSource,
    DataTable,
    HTMLTemplateFormatter,
    NumberFormatter,
    StringFormatter,
    TableColumn,
)

MAX_TABLE_ROWS = 5_000
"""Rows a table embeds at most (its first, in the order given: the callers sort the most time first); a trace
of a million distinct names would otherwise put them all in the page. `rows_note` says what was cut."""

TableColumns = Sequence[tuple[str, str, str | None]]
"""A table's columns as (field, title, numeral format), the format None for a text column."""


ESCAPED_SUFFIX = "_escaped"
"""A text column with hover titles has a companion column, its name (as an identifier) plus this suffix, holding
its text HTML-escaped (quotes included); the cell's template inserts only that one."""


def escaped_field(field: str) -> str:
    """The companion column of `field`: a name the template can use as a variable ("source ops" →
    "source_ops_escaped")."""
    return re.sub(r"\W", "_", field) + ESCAPED_SUFFIX


def hover_formatter(field: str) -> HTMLTemplateFormatter:
    """A cell showing the text of column `field` with the whole text as its hover title (a long kernel name cut
    by the column's width reads whole on hover). The template inserts the companion column of escaped text
    (`escaped_text`), never the raw one, so a name holding markup shows as text."""
    escaped = escaped_field(field)
    return HTMLTemplateFormatter(template=f'<span title="<%= {escaped} %>"><%= {escaped} %></span>')


def escaped_text(values: Any) -> np.ndarray:
    """Text for a template: each value as a str with &, <, >, " and ' escaped ("" for a missing one)."""
    return np.array([html.escape("" if v is None or (isinstance(v, float) and v != v) else str(v), quote=True)
                     for v in values], dtype=object)


def data_table(frame: pd.DataFrame, columns: TableColumns, *, width: int, height: int,
               widths: Mapping[str, int] | None = None, hover: Sequence[str] = (),
               **options: Any) -> DataTable:
    """A sortable table of the `columns` that `frame` has (the others left out). Text cells use a plain-text
    formatter, so names from traces stay text, except the text columns in `hover`: those show their whole text
    on hover through a template that inserts its escaped copy (`hover_formatter`; so a table whose source is
    replaced later, with no such copy, leaves `hover` empty). A missing
    number (NaN) is an empty cell; relative column widths are 360 for `name` and 100 for the others unless
    `widths` gives one; `options` go to the DataTable (`name`, `reorderable`, ...). Only the first
    `MAX_TABLE_ROWS` rows are embedded (`rows_note`)."""
    widths = widths or {}
    frame = frame.head(MAX_TABLE_ROWS)
    present = [(field, title, fmt) for field, title, fmt in columns if field in frame.columns]
    shown = frame[[field for field, _, _ in present]]
    table_columns = []
    for field, title, fmt in present:
        if fmt is None and field in hover:
            formatter = hover_formatter(field)
            shown = shown.assign(**{escaped_field(field): escaped_text(frame[field].to_numpy(dtype=object))})
        elif fmt is None:
            formatter = StringFormatter()
        else:
            formatter = NumberFormatter(format=fmt, nan_format="", null_format="")
        table_columns.append(TableColumn(field=field, title=title, formatter=formatter,
                                         width=widths.get(field, 360 if field == "name" else 100)))
    return DataTable(source=frame_source(shown), columns=table_columns,
                     width=width, height=height, index_position=None, sortable=True, **options)


DURATION_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
"""Units of a duration column, largest first, with their size in ns."""


def duration_unit(values_ns: Any) -> tuple[float, str, str]:
    """(size in ns, unit, numeral format) for a column of durations in ns: the unit of its largest value
    (ms for 12,345,678 ns), so every row of the column shares one unit; three decimals, none for ns."""
    values = np.abs(np.asarray(values_ns, dtype=np.float64))
    largest = float(np.nanmax(values)) if values.size and not np.isnan(values).all() else 0.0
    size, unit = next(((size, unit) for size, unit in DURATION_UNITS if largest >= size), DURATION_UNITS[-1])
    return size, unit, "0,0" if unit == "ns" else "0,0.000"


def frame_source(frame: pd.DataFrame) -> ColumnDataSource:
    """A ColumnDataSource of a frame's columns (not the frame itself: bokeh would add its index)."""
    return ColumnDataSource({name: frame[name].to_numpy() for name in frame.columns})


def rows_note(rows: int, noun: str = "rows") -> str:
    """What a heading adds for a table of `rows` rows: "" when `data_table` embeds them all, else
    " (first 5,000 of 20,000 names shown)"."""
    return "" if rows <= MAX_TABLE_ROWS else f" (first {MAX_TABLE_ROWS:,} of {rows:,} {noun} shown)"
