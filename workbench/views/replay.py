"""Views of an op replay (`workbench.replay.table`): the trace's time of each top op beside its time replayed alone.

- `replay_text`: the table as text blocks (`workbench replay` prints them), with what the figures mean;
- `replay_view`: a Bokeh layout (`workbench replay --html`, notebooks): a bar chart of trace against replayed
  time per signature (log axis, one bar per variant), then the sortable table.

Both take the replay DataFrame and compute nothing of their own. Op names and signatures come from traces: the
chart's categories are drawn as text on the canvas, the hover shows fields as text, the table uses plain-text
cells and headings are Divs rendered as text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, FactorRange, HoverTool, LayoutDOM, LogTicker
from bokeh.plotting import figure
from bokeh.transform import dodge

from workbench.views._table import data_table, duration_unit
from workbench.views.text_tables import (
    Block,
    Cell,
    TextTable,
    cells,
    format_count,
    format_duration,
    format_number,
    status_cell,
)

VARIANT_COLORS = {"trace": "#6d6d6d", "eager": "#4c72b0", "bf16": "#dd8452", "compile": "#55a868"}
"""Bar colour of the trace's time and of each replay variant."""

TEXT_LEFT = frozenset({"op", "inputs", "bound", "status", "reason"})
"""Text columns of `replay_text`'s table (the others are figures)."""


def _variants(table: pd.DataFrame) -> list[str]:
    """The variants the replay ran (the table's attrs), else those with any time."""
    asked = table.attrs.get("variants")
    if asked:
        return list(asked)
    return [v for v in ("eager", "bf16", "compile") if table[f"replay_{v}_ns"].notna().any()]


def replay_summary(table: pd.DataFrame) -> str:
    """One paragraph: how the replay was timed, what its floor is, and how to read the ratio."""
    attrs = table.attrs
    ok = int((table["status"] == "ok").sum())
    floor = attrs.get("floor_ns")
    parts = [
        f"{ok:,} of {len(table):,} op signatures replayed (top by self time in the measured steps)",
        f"variants {', '.join(_variants(table))}; {attrs.get('warmup', '?')} warm-up and "
        f"{attrs.get('iterations', '?')} interleaved rounds, medians; {attrs.get('threads', '?')} torch thread(s)",
        f"roofline against {attrs['device']}" if attrs.get("device") else "no device figures: no roofline bound",
    ]
    if floor is not None:
        parts.append(f"replay floor {format_duration(floor)} per call (the cheapest op call through the replay's "
                     "path): times near it are call overhead, not the op")
    parts.append("eager/trace below 1: the trace's time includes the profiler's cost for each nested op")
    if attrs.get("ort"):
        parts.append(str(attrs["ort"]))
    return ". ".join(parts) + "."


def replay_text(table: pd.DataFrame) -> list[Block]:
    """The replay as text blocks: the summary paragraph and one table row per signature, with a time column per
    variant that ran."""
    variants = _variants(table)
    columns = ("op", "inputs", "calls", "trace", *variants, "eager/trace", "FLOP/B", "bound", "status", "reason")
    rows = tuple(cells(
        r["name"], r["signature"], Cell(format_count(r["calls"])), Cell(format_duration(r["trace_ns"])),
        *(Cell(format_duration(r[f"replay_{v}_ns"])) for v in variants),
        Cell("-" if pd.isna(r["ratio"]) else f"{r['ratio']:.2f}"),
        Cell(format_number(None if pd.isna(r["intensity"]) else r["intensity"])), r["bound"] or "-",
        status_cell(r["status"]), r["reason"] or "") for r in table.to_dict("records"))
    title = "op replay: each signature's median time per call in the trace and replayed alone"
    return [replay_summary(table), TextTable(title, columns, rows, left=TEXT_LEFT)]


def replay_chart(table: pd.DataFrame, *, width: int = 1000) -> LayoutDOM:
    """Horizontal bars per signature: its time in the trace and replayed under each variant (log axis)."""
    timed = table[table["trace_ns"] > 0].reset_index(drop=True)
    if timed.empty:
        return Div(text="No op with a time in the trace to draw.", render_as_text=True)
    series = ["trace", *_variants(timed)]
    columns = {"trace": timed["trace_ns"], **{s: timed[f"replay_{s}_ns"] for s in series[1:]}}
    every = np.concatenate([c.to_numpy(dtype=np.float64) for c in columns.values()])
    drawn = every[~np.isnan(every) & (every > 0)]
    size, unit, _ = duration_unit(drawn)
    labels = [f"{i + 1}. {_short(name)}" for i, name in enumerate(timed["name"])]
    source = ColumnDataSource({"label": labels, "name": timed["name"].astype(str).to_numpy(dtype=object),
                               "signature": timed["signature"].astype(str).to_numpy(dtype=object),
                               **{s: c.to_numpy(dtype=np.float64) / size for s, c in columns.items()}})
    low = float(drawn.min()) / size / 2
    fig = figure(y_range=FactorRange(*reversed(labels)), x_axis_type="log", width=width,
                 height=min(80 + 18 * len(series) * len(labels), 2400), tools="save,xwheel_zoom,xpan,reset",
                 title=f"median time per call ({unit}): in the trace and replayed alone")
    bar = 0.8 / len(series)
    for k, name in enumerate(series):
        renderer = fig.hbar(y=dodge("label", 0.4 - bar * (k + 0.5), range=fig.y_range), left=low, right=name,
                            height=bar * 0.9, source=source, fill_color=VARIANT_COLORS[name], line_color=None,
                            legend_label=name)
        fig.add_tools(HoverTool(renderers=[renderer], tooltips=[("op", "@name"), ("inputs", "@signature"),
                                                               (name, f"@{{{name}}}{{0,0.000}} {unit}")]))
    fig.xaxis.ticker = LogTicker(mantissas=[1, 2, 5])  # a label every 1-2-5: short bars have one under them
    fig.legend.location = "bottom_right"
    fig.legend.click_policy = "hide"
    fig.yaxis.major_label_text_font_size = "10px"
    fig.ygrid.grid_line_color = None
    return fig


def _short(name: str, limit: int = 48) -> str:
    """An op name cut to `limit` characters for an axis label (the hover shows it whole)."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def replay_table_view(table: pd.DataFrame, *, width: int = 1000, height: int = 420) -> LayoutDOM:
    """The replay as a sortable table, each time column (the trace's, then each variant's that ran) in the unit of
    its largest value."""
    frame = table[["name", "signature", "calls", "ratio", "flops", "intensity", "bound", "status", "reason"]].copy()
    columns: list[tuple[str, str, str | None]] = [("name", "op", None), ("signature", "signature", None),
                                                  ("calls", "calls", "0,0")]
    for field, title in (("trace_ns", "trace"), *((f"replay_{v}_ns", v) for v in _variants(table))):
        size, unit, fmt = duration_unit(table[field].fillna(0))
        frame[field] = table[field].to_numpy(dtype=np.float64) / size
        columns.append((field, f"{title} ({unit})", fmt))
    frame["bound"] = frame["bound"].fillna("-")
    columns += [("ratio", "eager/trace", "0.00"), ("flops", "FLOP", "0,0"), ("intensity", "FLOP/B", "0,0.00"),
                ("bound", "bound", None), ("status", "status", None), ("reason", "reason", None)]
    widths = {"name": 260, "signature": 300, "reason": 360}
    return data_table(frame, columns, width=width, height=height, widths=widths,
                      hover=("name", "signature", "reason"), reorderable=False)


def replay_view(table: pd.DataFrame, title: str, *, width: int = 1000) -> LayoutDOM:
    """The replay's page: a heading, the summary, the chart and the table."""
    return column(Div(text=title, render_as_text=True, styles={"font-weight": "bold", "font-size": "15px"}),
                  Div(text=replay_summary(table), render_as_text=True, width=width),
                  replay_chart(table, width=width), replay_table_view(table, width=width))
