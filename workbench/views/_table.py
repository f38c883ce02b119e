"""The views' one way to build a Bokeh DataTable from a DataFrame, so every table sorts, formats text cells
and sizes its columns alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, StringFormatter, TableColumn

MAX_TABLE_ROWS = 5_000
"""Rows a table embeds at most (its first, in the order given: the callers sort the most time first); a trace
of a million distinct names would otherwise put them all in the page. `rows_note` says what was cut."""

TableColumns = Sequence[tuple[str, str, str | None]]
"""A table's columns as (field, title, numeral format), the format None for a text column."""


def data_table(frame: pd.DataFrame, columns: TableColumns, *, width: int, height: int,
               widths: Mapping[str, int] | None = None, **options: Any) -> DataTable:
    """A sortable table of the `columns` that `frame` has (the others left out). Text cells use a plain-text
    formatter, so names from traces stay text; a missing number (NaN) is an empty cell; relative column widths
    are 360 for `name` and 100 for the others unless `widths` gives one; `options` go to the DataTable
    (`name`, `reorderable`, ...). Only the first `MAX_TABLE_ROWS` rows are embedded (`rows_note`)."""
    widths = widths or {}
    frame = frame.head(MAX_TABLE_ROWS)
    present = [(field, title, fmt) for field, title, fmt in columns if field in frame.columns]
    table_columns = []
    for field, title, fmt in present:
        formatter = StringFormatter() if fmt is None else NumberFormatter(format=fmt, nan_format="", null_format="")
        table_columns.append(TableColumn(field=field, title=title, formatter=formatter,
                                         width=widths.get(field, 360 if field == "name" else 100)))
    return DataTable(source=frame_source(frame[[field for field, _, _ in present]]), columns=table_columns,
                     width=width, height=height, index_position=None, sortable=True, **options)


def frame_source(frame: pd.DataFrame) -> ColumnDataSource:
    """A ColumnDataSource of a frame's columns (not the frame itself: bokeh would add its index)."""
    return ColumnDataSource({name: frame[name].to_numpy() for name in frame.columns})


def rows_note(rows: int, noun: str = "rows") -> str:
    """What a heading adds for a table of `rows` rows: "" when `data_table` embeds them all, else
    " (first 5,000 of 20,000 names shown)"."""
    return "" if rows <= MAX_TABLE_ROWS else f" (first {MAX_TABLE_ROWS:,} of {rows:,} {noun} shown)"
