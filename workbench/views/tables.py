"""Op and kernel tables: one sortable row per name, from `workbench.analysis.breakdown.op_table`.

Linking to the timeline. `op_table_view` returns a column holding one `DataTable` named `OP_TABLE_NAME`;
its `source` (a ColumnDataSource) has one row per op name, the name in its `name` column. Selecting rows
sets `source.selected.indices`. `link_table_to_timeline(table_source, *span_sources)` turns that into
a selection of every span whose `name` equals a selected row's name in each span source (any
ColumnDataSource with a `name` column, such as the timeline's span source), and clears it when the
table selection is cleared. The dashboard does:

    view = op_table_view(trace)
    link_table_to_timeline(view.select_one({"name": OP_TABLE_NAME}).source, timeline_span_source)

Names come from traces and are untrusted: the name column shows each whole name on hover through a template
that inserts only its HTML-escaped copy (`workbench.views._table.hover_formatter`); other cells render as text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, CustomJS, Div
from bokeh.models.layouts import LayoutDOM

from workbench.analysis.breakdown import is_wrapper, op_table
from workbench.trace import Trace
from workbench.views._table import data_table, duration_unit, rows_note

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
                  width: int = 1000, height: int = 400, wrappers: bool = False) -> LayoutDOM:
    """A sortable table of the events of `kinds` per name, most total time first (see `op_table`).

    Columns: name (whole on hover), calls, total, self and mean time, share of step time and of self time, device
    time (a kernel's own, an op's kernels'), and GFLOP and achieved GFLOP/s where FLOPs are known. Each time
    column has one unit, that of its largest value (`duration_unit`: ms, µs...). Profiler wrappers
    (`ProfilerStep#N`...) are left out unless `wrappers`, and the heading says how many. Only events starting in
    `window` (ns) count when one is given. A trace without such events gives a note.
    """
    table = op_table(trace, kinds, window)
    hidden = 0
    if not wrappers and not table.empty:
        wrapper = is_wrapper(table["name"])
        hidden = int(wrapper.sum())
        table = table[~wrapper].reset_index(drop=True)
    scope = "whole trace" if window is None else f"{window[0] / 1e6:,.3f} to {window[1] / 1e6:,.3f} ms"
    label = "/".join(kinds)
    if table.empty:
        return Div(text=f"No {label} events in this trace ({scope}).", render_as_text=True)
    frame = pd.DataFrame({
        "name": table["name"].to_numpy(dtype=object),
        "calls": table["calls"].to_numpy(dtype=np.int64),
        "step_share": table["step_share"].to_numpy(dtype=np.float64),
        "share": table["share"].to_numpy(dtype=np.float64),
        "gflop": table["flops"].to_numpy(dtype=np.float64) / 1e9,
        "gflops": table["flops_per_s"].to_numpy(dtype=np.float64) / 1e9,
    })
    times = {}
    for field, source, title in (("total", "total_ns", "total"), ("self", "self_ns", "self"),
                                 ("mean", "mean_ns", "mean"), ("device", "device_ns", "device")):
        size, unit, fmt = duration_unit(table[source])
        frame[field] = table[source].to_numpy(dtype=np.float64) / size
        times[field] = (f"{title} ({unit})", fmt)
    columns = [("name", "name", None), ("calls", "calls", "0,0"), ("total", *times["total"]),
               ("self", *times["self"]), ("mean", *times["mean"]),
               ("step_share", "share of step", "0.0%"), ("share", "share (self)", "0.0%"),
               ("device", *times["device"]), ("gflop", "GFLOP", "0,0.000"), ("gflops", "GFLOP/s", "0,0.00")]
    widths = {field: 80 for field, _, _ in columns} | {"name": 560}
    view = data_table(frame, columns, width=width, height=height, widths=widths, hover=("name",),
                      reorderable=False, name=OP_TABLE_NAME)
    left_out = f"; {hidden:,} profiler wrappers (ProfilerStep#N...) left out" if hidden else ""
    heading = Div(text=f"{label}: {len(table):,} names{rows_note(len(table), 'names')}, {scope}{left_out}; "
                       "hover a name to read it whole; select rows to highlight them in the timeline",
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
