"""The memory map: bytes in use over time, the address map of allocations, and the live set at the peak.

One section per device: (a) allocated and reserved bytes as step lines with the peak marked, (b) each
allocation a rectangle from its alloc to its free time at its compact address offset, coloured by the
op that allocated it (torch memory_viz's "active memory timeline"), (c) a table of the allocations
live at the peak. Every figure shares one x range in ns from the trace origin, the timeline's units,
so passing the timeline's `x_range` links their zoom. Data comes from `workbench.analysis.memory`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    Div,
    HoverTool,
    Legend,
    LegendItem,
    NumeralTickFormatter,
    Range,
    Range1d,
    Span,
)
from bokeh.models.layouts import LayoutDOM
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.analysis.memory import allocations, downsample_timeline, memory_timeline, peak, trace_end_ns
from workbench.hardware.units import format_bytes
from workbench.trace import Trace
from workbench.views._style import time_ticks
from workbench.views._table import data_table

OTHER = "other"
OTHER_COLOR = "#c8c8c8"
BYTES_FORMAT = "0.0 b"
"""Numbro format of a byte count in binary units (KiB, MiB, ...), for axes, tooltips and tables."""
_TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
_LEGEND_CHARS = 40


def memory_map(trace: Trace, *, x_range: Range | None = None, width: int = 1000, top_ops: int = 10,
               max_rects: int = 20_000, max_points: int = 20_000, max_live: int = 1_000) -> LayoutDOM:
    """The memory map of a trace, one section per device (accelerators first).

    `x_range` (ns from the trace origin) is shared by every figure; by default one spanning the trace.
    The address map colours the `top_ops` (at most 10) allocating ops with the most bytes and groups
    the rest as "other"; it draws the `max_rects` largest allocations of a device and the step lines at most about
    `max_points` points per device, and the peak table the `max_live` largest live allocations; each
    says so when it drops any. A trace without memory records gives a note instead.
    """
    timeline = memory_timeline(trace)
    if timeline.empty:
        return _note("No memory records in this trace: capture with profile_memory=True (torch.profiler) "
                     "to see the memory map.")
    end_ns = trace_end_ns(trace)
    if x_range is None:
        x_range = Range1d(0, max(end_ns, 1))
    shown = downsample_timeline(timeline, max_points)
    table = allocations(trace)
    unknown = table.attrs["unknown_address"]
    devices = sorted(timeline["device"].unique(), key=lambda d: (d == "cpu", d))
    sections = []
    for device in devices:
        ts_ns, peak_bytes, live = peak(trace, device, table)
        series = shown[shown["device"] == device]
        total_points = int((timeline["device"] == device).sum())
        sections += [
            _usage_figure(device, series, total_points, (ts_ns, peak_bytes), end_ns, x_range, width),
            _address_map(device, table[table["device"] == device], unknown.get(device, 0), x_range, width,
                         top_ops, max_rects),
            *_peak_table(device, ts_ns, peak_bytes, live, width, max_live),
        ]
    return column(sections)


def _note(text: str) -> Div:
    """A short plain-text note (never parsed as HTML: it may quote names from the trace)."""
    return Div(text=text, render_as_text=True)


def _usage_figure(device: str, series: pd.DataFrame, total_points: int, at_peak: tuple[int, int], end_ns: int,
                  x_range: Range, width: int) -> figure:
    """(a) Allocated and reserved bytes over time as step lines, the peak marked."""
    title = f"{device}: memory in use"
    if len(series) < total_points:
        title += f" (downsampled: {len(series):,} of {total_points:,} records, min and max kept per bin)"
    fig = figure(title=title, x_range=x_range, width=width, height=220, tools=_TOOLS, active_scroll="xwheel_zoom")
    last = series.iloc[[-1]].assign(ts_ns=max(end_ns, int(series["ts_ns"].iloc[-1])))  # hold the last value
    held = pd.concat([series, last], ignore_index=True)
    source = ColumnDataSource({c: held[c].to_numpy() for c in ("ts_ns", "allocated_bytes", "reserved_bytes")})
    lines = [fig.step("ts_ns", "allocated_bytes", source=source, mode="after", line_width=2,
                      legend_label="allocated")]
    tooltips = [("time", "@ts_ns{0,0} ns"), ("allocated", f"@allocated_bytes{{{BYTES_FORMAT}}}")]
    if (series["reserved_bytes"] > 0).any():  # CPU traces record 0 reserved: nothing to draw
        lines.append(fig.step("ts_ns", "reserved_bytes", source=source, mode="after", line_dash="dashed",
                              color="gray", legend_label="reserved"))
        tooltips.append(("reserved", f"@reserved_bytes{{{BYTES_FORMAT}}}"))
    fig.add_tools(HoverTool(renderers=lines, mode="vline", tooltips=tooltips))
    ts_ns, peak_bytes = at_peak
    fig.add_layout(Span(location=ts_ns, dimension="height", line_color="crimson", line_dash="dotted"))
    marker = fig.scatter([ts_ns], [peak_bytes], marker="inverted_triangle", size=12, color="crimson",
                         legend_label="peak")
    fig.add_tools(HoverTool(renderers=[marker], tooltips=[("peak", f"@y{{{BYTES_FORMAT}}}"), ("at", "@x{0,0} ns")]))
    _style_axes(fig, "bytes")
    fig.legend.location = "top_left"
    return fig


def _address_map(device: str, table: pd.DataFrame, unknown: int, x_range: Range, width: int, top_ops: int,
                 max_rects: int) -> LayoutDOM:
    """(b) Each allocation a rectangle over its lifetime at its compact address offset, coloured by op."""
    if table.empty:
        return _note(f"{device}: no address map, the {unknown:,} memory records carry no address "
                     "(this profiler or format does not record them).")
    drawn = table.nlargest(max_rects, "size", keep="first") if len(table) > max_rects else table
    colors = _op_colors(drawn, top_ops)
    label = drawn["op_name"].where(drawn["op_name"].isin(colors), OTHER)
    source = ColumnDataSource({
        "alloc_ns": drawn["alloc_ns"].to_numpy(),
        "free_ns": drawn["free_ns"].to_numpy(),
        "offset": drawn["offset"].to_numpy(),
        "top": (drawn["offset"] + drawn["size"]).to_numpy(),
        "size": drawn["size"].to_numpy(),
        "op_name": drawn["op_name"].to_numpy(),
        "label": label.to_numpy(),
        "color": label.map({**colors, OTHER: OTHER_COLOR}).to_numpy(),
        "address": [f"{a:#x}" for a in drawn["addr"].to_numpy()],
        "lifetime": np.where(drawn["before_trace"], "allocated before the trace",
                             np.where(drawn["freed"], "freed", "never freed")),
    })
    title = f"{device}: address map, {len(table):,} allocations, coloured by allocating op"
    if len(drawn) < len(table):
        title += f" (largest {len(drawn):,} of {len(table):,} shown)"
    if unknown:
        title += f"; {unknown:,} records without an address not shown"
    fig = figure(title=title, x_range=x_range, width=width, height=320, tools=_TOOLS, active_scroll="xwheel_zoom")
    rects = fig.quad(left="alloc_ns", right="free_ns", bottom="offset", top="top", source=source,
                     fill_color="color", line_color=None, fill_alpha=0.85)
    fig.add_tools(HoverTool(renderers=[rects], tooltips=[
        ("op", "@op_name"), ("size", f"@size{{{BYTES_FORMAT}}}"), ("address", "@address"),
        ("alloc", "@alloc_ns{0,0} ns"), ("free", "@free_ns{0,0} ns"), ("", "@lifetime")]))
    first_row = {name: i for i, name in reversed(list(enumerate(source.data["label"])))}
    items = [LegendItem(label=name[:_LEGEND_CHARS], renderers=[rects], index=first_row[name])
             for name in [*colors, OTHER] if name in first_row]
    fig.add_layout(Legend(items=items, title="allocating op"), "right")
    _style_axes(fig, "address offset")
    return fig


def _op_colors(table: pd.DataFrame, top_ops: int) -> dict[str, str]:
    """A palette colour for each of the `top_ops` ops with the most bytes allocated, most first."""
    ranked = table.groupby("op_name", sort=False)["size"].sum().sort_values(ascending=False, kind="stable")
    names = list(ranked.index[:min(top_ops, len(Category10_10))])
    return dict(zip(names, Category10_10, strict=False))


def _peak_table(device: str, ts_ns: int, peak_bytes: int, live: pd.DataFrame, width: int,
                max_live: int) -> list[LayoutDOM]:
    """(c) A heading and a table of the allocations live at the peak, largest first."""
    heading = (f"{device}: peak of {format_bytes(peak_bytes)} allocated at {_time_text(ts_ns)}; "
               f"{len(live):,} live allocations with a known address, {format_bytes(int(live['size'].sum()))}")
    if live.empty:
        return [_note(heading + ".")]
    if len(live) > max_live:
        heading += f" (the largest {max_live:,} listed)"
        live = live.head(max_live)
    frame = pd.DataFrame({
        "size": live["size"].to_numpy(),
        "op_name": live["op_name"].to_numpy(),
        "alloc_ms": live["alloc_ns"].to_numpy() / 1e6,
        "address": [f"{a:#x}" for a in live["addr"].to_numpy()],
    })
    columns = [("size", "size", BYTES_FORMAT), ("op_name", "allocating op", None),
               ("alloc_ms", "allocated at (ms)", "0,0.000"), ("address", "address", None)]
    table = data_table(frame, columns, width=width, height=min(280, 30 + 25 * len(live)),
                       widths={"op_name": 400, "alloc_ms": 120, "address": 160}, reorderable=False, hover=("op_name",))
    return [_note(heading + ":"), table]


def _style_axes(fig: figure, y_label: str) -> None:
    fig.xaxis.formatter = time_ticks()
    fig.xaxis.axis_label = "time from trace start"
    fig.yaxis.formatter = NumeralTickFormatter(format=BYTES_FORMAT)
    fig.yaxis.axis_label = y_label


def _time_text(ns: int) -> str:
    """A time in ns from the trace origin in a readable unit, e.g. '12.345 ms'."""
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{ns / scale:,.3f} {unit}"
    return f"{ns} ns"
