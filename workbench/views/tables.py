"""Op and kernel tables: one sortable row per name, from `workbench.analysis.breakdown.op_table`.

Linking to the timeline. `op_table_view` returns a column holding one `DataTable` named `OP_TABLE_NAME`;
its `source` (a ColumnDataSource) has one row per op name, the name in its `name` column. Selecting rows
sets `source.selected.indices`. `link_table_to_timeline(table_source, *span_sources)` turns that into
a selection of every span whose `name` equals a selected row's name in each span source (any
ColumnDataSource with a `name` column, such as the timeline's span source), and clears it when the
table selection is cleared. The dashboard does:

    view = op_table_view(trace)
    link_table_to_timeline(view.select_one({"name": OP_TABLE_NAME}).source, timeline_span_source)

Names come from traces and are untrusted: every cell renders through a text formatter, never HTML.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, CustomJS, Div
from bokeh.models.layouts import LayoutDOM

from workbench.analysis.breakdown import op_table
from workbench.trace import Trace
from workbench.views._table import data_table, rows_note

OP_TABLE_NAME = "op-table"
"""Bokeh `name` of the DataTable in `op_table_view`'s layout."""

_SELECT_SPANS = """
const names = new Set(table.selected.indices.map((i) => table.data.name[i]))
for (const spans of span_sources) {
  const column = spans.data.name
  const hits = []
  if (names.size > 0) {
    for (let i = 0; i < column.length; i++) {
      if (names.has(column[i])) hits.push(i)
    }
  }
  spans.selected.indices = hits
}
"""


def op_table_view(trace: Trace, kinds: tuple[str, ...] = ("op",), window: tuple[int, int] | None = None, *,
                  width: int = 1000, height: int = 400) -> LayoutDOM:
    """A sortable table of the events of `kinds` per name, most total time first (see `op_table`).

    Columns: name, calls, total, self and mean time, share of step time and of self time, device time launched, and
    GFLOP and achieved GFLOP/s where FLOPs are known. Times are in ms, or µs when the largest total is
    under 10 ms. Only events starting in `window` (ns) count when one is given. A trace without such
    events gives a note.
    """
    table = op_table(trace, kinds, window)
    scope = "whole trace" if window is None else f"{window[0] / 1e6:,.3f} to {window[1] / 1e6:,.3f} ms"
    label = "/".join(kinds)
    if table.empty:
        return Div(text=f"No {label} events in this trace ({scope}).", render_as_text=True)
    scale, unit = (1e6, "ms") if table["total_ns"].max() >= 10e6 else (1e3, "µs")
    frame = pd.DataFrame({
        "name": table["name"].to_numpy(dtype=object),
        "calls": table["calls"].to_numpy(),
        "total": table["total_ns"].to_numpy() / scale,
        "self": table["self_ns"].to_numpy() / scale,
        "mean": table["mean_ns"].to_numpy() / scale,
        "step_share": table["step_share"].to_numpy(dtype=np.float64),
        "share": table["share"].to_numpy(dtype=np.float64),
        "device": table["device_ns"].to_numpy() / scale,
        "gflop": table["flops"].to_numpy(dtype=np.float64) / 1e9,
        "gflops": table["flops_per_s"].to_numpy(dtype=np.float64) / 1e9,
    })
    columns = [("name", "name", None), ("calls", "calls", "0,0"), ("total", f"total ({unit})", "0,0.000"),
               ("self", f"self ({unit})", "0,0.000"), ("mean", f"mean ({unit})", "0,0.000"),
               ("step_share", "share of step", "0.0%"), ("share", "share (self)", "0.0%"),
               ("device", f"device ({unit})", "0,0.000"), ("gflop", "GFLOP", "0,0.000"),
               ("gflops", "GFLOP/s", "0,0.00")]
    view = data_table(frame, columns, width=width, height=height, widths={"name": 320},
                      reorderable=False, name=OP_TABLE_NAME)
    heading = Div(text=f"{label}: {len(table):,} names{rows_note(len(table), 'names')}, {scope}; "
                       "select rows to highlight them in the timeline",
                  render_as_text=True)
    return column(heading, view)


def link_table_to_timeline(table_source: ColumnDataSource, *span_sources: ColumnDataSource) -> CustomJS:
    """Select, in each span source, the spans named like the table's selected rows; returns the callback.

    Both sides need a `name` column. The link runs in the browser (no Python kernel needed) on every
    change of the table's selection; an empty selection clears the spans' selection.
    """
    callback = CustomJS(args={"table": table_source, "span_sources": list(span_sources)}, code=_SELECT_SPANS)
    table_source.selected.js_on_change("indices", callback)
    return callback
