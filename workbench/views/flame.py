"""The call tree tab: host spans as an icicle (a top-down flame graph) and the device work of each launching op.

`call_tree_panel` stacks a line saying the range covered and its total, the icicle of
`workbench.analysis.call_tree.call_tree` and the table of `kernels_by_op`. The icicle's boxes are call paths: x is
the position inside the parent's time (laid out by the analysis, heaviest child first), y the depth, the widths
the time inside the range. Row 0 is the whole range, row 1 each thread (when the tree is per thread), then the
paths. Hovering a box shows its name, calls, total and self time; clicking one zooms the icicle to it and, given the
timeline's `x_range` (and its layout, whose span source and remote say what the timeline can show), jumps the
timeline to that path's first call; clicking a table row jumps it to the op's first launching call or the kernel's
first run. Names come from traces: the icicle draws them as text glyphs and the table through its escaping
template.
"""

from __future__ import annotations

import colorsys
import zlib

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    Div,
    HoverTool,
    LayoutDOM,
    PanTool,
    Range1d,
    ResetTool,
    TapTool,
    WheelZoomTool,
)
from bokeh.plotting import figure

from workbench.analysis.call_tree import HOST_KINDS, MAX_NODES, OTHER, call_tree, kernels_by_op, resolve_window
from workbench.analysis.timeline import strip_device
from workbench.trace import Trace
from workbench.views import timeline_js as js
from workbench.views._style import KIND_COLORS
from workbench.views._table import data_table, duration_unit, rows_note
from workbench.views.text_tables import format_duration
from workbench.views.timeline import LABEL_CHAR_PX, LABEL_FONT_PX, LABEL_PAD_PX, MAX_LABELS, REMOTE, SPANS_SOURCE

FLAME_PLOT = "flame graph"
"""Bokeh `name` of the icicle figure."""
FLAME_SOURCE = "flame nodes"
"""Bokeh `name` of the icicle's ColumnDataSource: one row per box, row 0 the whole range."""
FLAME_HEADING = "flame heading"
"""Bokeh `name` of the line above the icicle (the range covered and its total)."""
KERNELS_TABLE = "kernels by op"
"""Bokeh `name` of the DataTable of device work by launching op."""

ROW_PX = 20
"""Height of one depth of the icicle, in pixels."""
ROOT, THREAD = "all", "thread"
"""`kind` of the icicle's box of the whole range and of a thread's box (no event kind is called so)."""
FLAME_COLORS = tuple("#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in colorsys.hls_to_rgb(hue, 0.72, 0.8)))
                     for hue in np.linspace(0.0, 0.15, 12))
"""Warm, light fills of op boxes (the classic flame palette), picked by a hash of the name, so one op has one colour
wherever it is called; black names read on all of them."""
BOX_COLORS = {ROOT: "#d9d9d9", THREAD: "#e8e8e8", OTHER: KIND_COLORS["other"], "annotation": "#f2b48c",
              "python": KIND_COLORS["python"]}
"""Fills of the boxes not coloured by name: the range, threads, left-out paths, annotations and Python frames."""

_TAP = js.JUMP + """
const i = cb_obj.indices[0];
if (i == null) return;
const d = nodes.data;
fxr.setv({start: d.left[i], end: Math.max(d.right[i], d.left[i] + 1)});
if (xr != null) jump(xr, spans, d.first_start_ns[i], d.first_dur_ns[i]);
"""
"""A click on a box: the icicle zooms to it, the timeline jumps to the path's first call (`remote` and `spans` are
the timeline's, or stand-ins with no server and no embedded windows)."""

_JUMP_TO_ROW = js.JUMP + """
const i = cb_obj.indices[0];
if (i == null || xr == null) return;
jump(xr, spans, rows.data.first_start_ns[i], rows.data.first_dur_ns[i]);
"""
"""A click on a table row jumps the timeline to the op's first launching call or the device work's first run."""


def call_tree_panel(trace: Trace, window: tuple[int, int] | None = None, *, scope: str = "",
                    x_range: Range1d | None = None, timeline: LayoutDOM | None = None, width: int = 1200,
                    kinds: tuple[str, ...] = HOST_KINDS, max_nodes: int = MAX_NODES) -> LayoutDOM:
    """The icicle of the host spans over `window` ([start, end) ns, the whole trace when None; `scope` names it,
    such as "the measure phase") and the table of device work by launching op below it, both jumping the
    timeline's `x_range` when given (see the module's docstring)."""
    return column(flame_graph(trace, window, scope=scope, x_range=x_range, timeline=timeline, width=width,
                              kinds=kinds, max_nodes=max_nodes),
                  kernels_by_op_view(trace, window, scope=scope, x_range=x_range, timeline=timeline, width=width))


def flame_graph(trace: Trace, window: tuple[int, int] | None = None, *, scope: str = "",
                x_range: Range1d | None = None, timeline: LayoutDOM | None = None, width: int = 1200,
                kinds: tuple[str, ...] = HOST_KINDS, threads: bool = True, max_nodes: int = MAX_NODES) -> LayoutDOM:
    """The icicle of `call_tree(trace, window, kinds=kinds, threads=threads, max_nodes=max_nodes)` under a line
    saying the range it covers and its total; a note when no host span of `kinds` falls in the range."""
    nodes = call_tree(trace, window, kinds=kinds, threads=threads, max_nodes=max_nodes)
    low, high = _range(trace, window)
    where = f"{scope + ', ' if scope else ''}{format_duration(low)} to {format_duration(high)} from the trace start"
    if nodes.empty:
        return Div(text=f"No host spans ({', '.join(kinds)}) in {where}: no call tree to draw.", render_as_text=True,
                   width=width, name=FLAME_HEADING)
    boxes = icicle_boxes(nodes, (low, high))
    total = int(boxes["total_ns"].iat[0])
    calls = int(nodes.loc[nodes["parent"] < 0, "count"].sum())
    spread = f" on {boxes['kind'].eq(THREAD).sum():,} threads" if threads else " (threads merged)"
    cut = nodes["kind"].eq(OTHER).sum()
    left_out = f"; the lightest paths are summed in {cut:,} '{OTHER}' boxes" if cut else ""
    jumps = " and jump the timeline to the path's first call" if x_range is not None else ""
    heading = Div(render_as_text=True, width=width, name=FLAME_HEADING, text=(
        f"Call tree of host {'/'.join(kinds)} spans over {where}: total {format_duration(total)} in "
        f"{calls:,} top-level calls{spread}; a box's width is its time inside the range (its children's below it, "
        f"heaviest first){left_out}. Hover a box for its calls, total and self time; click one to zoom to it{jumps}; "
        "reset zooms out."))
    return column(heading, _icicle(boxes, x_range, timeline, width))


def icicle_boxes(nodes: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The boxes the icicle draws: the whole range (row 0), a box per thread when the nodes are per thread, then
    every node one row lower per depth, with `left`/`right` (ns of inclusive time), `level`, `name`, `kind`,
    `count`, `total_ns`, `self_ns`, `first_start_ns`, `first_dur_ns` and `path`."""
    tops = nodes[nodes["parent"] < 0]
    total = int(tops["total_ns"].sum())
    per_thread = bool(nodes["track"].ne("").any())
    root = pd.DataFrame({"left": [0], "right": [total], "level": [0], "name": [ROOT], "kind": [ROOT],
                         "count": [int(tops["count"].sum())], "total_ns": [total], "self_ns": [0],
                         "first_start_ns": [window[0]], "first_dur_ns": [window[1] - window[0]], "path": [""]})
    parts = [root]
    if per_thread:
        grouped = tops.groupby("track", sort=False)
        threads = pd.DataFrame({"left": grouped["offset_ns"].min(), "total_ns": grouped["total_ns"].sum(),
                                "count": grouped["count"].sum()}).reset_index()
        threads = threads.assign(right=threads["left"] + threads["total_ns"], level=1, kind=THREAD, self_ns=0,
                                 name=[strip_device(track, "cpu") for track in threads["track"]],
                                 first_start_ns=window[0], first_dur_ns=window[1] - window[0],
                                 path=threads["track"])
        parts.append(threads[root.columns])
    body = nodes.assign(left=nodes["offset_ns"], right=nodes["offset_ns"] + nodes["total_ns"],
                        level=nodes["depth"] + len(parts))
    parts.append(body[root.columns])
    boxes = pd.concat(parts, ignore_index=True)
    for column_name in ("left", "right", "level", "count", "total_ns", "self_ns", "first_start_ns", "first_dur_ns"):
        boxes[column_name] = boxes[column_name].astype(np.int64)
    return boxes


def _icicle(boxes: pd.DataFrame, x_range: Range1d | None, timeline: LayoutDOM | None, width: int) -> figure:
    """The icicle figure of `icicle_boxes`, with hover, labels that follow the zoom, and click to zoom and jump."""
    levels = int(boxes["level"].max()) + 1
    total = max(int(boxes["right"].max()), 1)
    source = ColumnDataSource({
        "left": boxes["left"].to_numpy(dtype=np.float64), "right": boxes["right"].to_numpy(dtype=np.float64),
        "y": boxes["level"].to_numpy(dtype=np.float64) + 0.5, "top": boxes["level"].to_numpy(dtype=np.float64),
        "bottom": boxes["level"].to_numpy(dtype=np.float64) + 0.94,
        "name": boxes["name"].astype(str).to_numpy(dtype=object), "kind": boxes["kind"].to_numpy(dtype=object),
        "color": np.array([_fill(name, kind) for name, kind in zip(boxes["name"], boxes["kind"], strict=True)],
                          dtype=object),
        "count": boxes["count"].to_numpy(), "total_ns": boxes["total_ns"].to_numpy(),
        "self_ns": boxes["self_ns"].to_numpy(), "first_start_ns": boxes["first_start_ns"].to_numpy(),
        "first_dur_ns": boxes["first_dur_ns"].to_numpy(), "share": boxes["total_ns"].to_numpy() / total,
    }, name=FLAME_SOURCE)
    flame_range = Range1d(0, total, bounds=(0, total), min_interval=1)
    pan, wheel = PanTool(dimensions="width"), WheelZoomTool(dimensions="width")
    fig = figure(width=width, height=ROW_PX * levels + 12, min_border_top=4, min_border_bottom=4,
                 x_range=flame_range, y_range=Range1d(levels, 0),
                 tools=[pan, wheel, TapTool(), ResetTool()], active_drag=pan, active_scroll=wheel, name=FLAME_PLOT,
                 toolbar_location="right")
    bars = fig.quad(left="left", right="right", top="top", bottom="bottom", source=source, fill_color="color",
                    line_color="white", line_width=0.5, nonselection_fill_alpha=1.0, nonselection_line_alpha=1.0,
                    selection_line_color="black", selection_line_width=1.5)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("", "@name"), ("kind", "@kind"), ("calls", "@count{count}"), ("total", "@total_ns{time}"),
        ("self", "@self_ns{time}"), ("share of the total", "@share{0.0%}")],
        formatters={"@count": js.hover(js.COUNT_HOVER), "@total_ns": js.hover(js.TIME_HOVER),
                    "@self_ns": js.hover(js.TIME_HOVER)}))
    labels = ColumnDataSource({"x": [], "y": [], "text": [], "color": []})
    fig.text(x="x", y="y", text="text", source=labels, text_align="center", text_baseline="middle",
             text_font_size=f"{LABEL_FONT_PX}px", text_color="color")
    refill = CustomJS(args={"source": source, "labels": labels, "bars": bars, "xr": flame_range, "plot": fig,
                            "width": width, "ink": dict.fromkeys(boxes["kind"].unique().tolist(), "black"),
                            "char_px": LABEL_CHAR_PX, "pad": LABEL_PAD_PX, "max_labels": MAX_LABELS}, code=js.LABELS)
    flame_range.js_on_change("start", refill)
    flame_range.js_on_change("end", refill)
    fig.js_on_change("inner_width", refill)
    spans = timeline.select_one({"name": SPANS_SOURCE}) if timeline is not None else None
    remote = timeline.select_one({"name": REMOTE}) if timeline is not None else None
    source.selected.js_on_change("indices", CustomJS(code="const remote = timeline_remote ?? {};\n" + _TAP, args={
        "nodes": source, "fxr": flame_range, "xr": x_range, "spans": spans or ColumnDataSource(),
        "timeline_remote": remote}))
    fig.xaxis.visible = False
    fig.yaxis.visible = False
    fig.grid.visible = False
    fig.outline_line_color = None
    return fig


def kernels_by_op_view(trace: Trace, window: tuple[int, int] | None = None, *, scope: str = "",
                       x_range: Range1d | None = None, timeline: LayoutDOM | None = None, width: int = 1200,
                       height: int = 360) -> LayoutDOM:
    """The device work of `kernels_by_op(trace, window)` as a table: each launching op (most device time first)
    followed by its kernels, indented; counts as integers, device time in one unit. Given the timeline's `x_range`,
    clicking a row jumps the timeline to it. A note when no device work was launched in the range."""
    table = kernels_by_op(trace, window)
    where = scope or "the whole trace"
    if table.empty:
        return Div(text=f"No device work launched in {where}: no kernels by launching op.", render_as_text=True,
                   width=width)
    size, unit, fmt = duration_unit(table["device_ns"])
    device = table["level"].to_numpy() == 1
    frame = pd.DataFrame({
        "name": np.where(device, "\u2003\u21b3 " + table["name"].astype(str), table["name"].astype(str)),
        "kind": table["kind"].to_numpy(dtype=object),
        "launches": table["launches"].to_numpy(dtype=np.int64),
        "calls": table["calls"].to_numpy(dtype=np.int64),
        "device": table["device_ns"].to_numpy(dtype=np.float64) / size,
        "share": table["share"].to_numpy(dtype=np.float64),
    })
    columns = [("name", "launching op ↳ device work", None), ("kind", "kind", None), ("launches", "launches", "0,0"),
               ("calls", "op calls", "0,0"), ("device", f"device time ({unit})", fmt), ("share", "share", "0.0%")]
    view = data_table(frame, columns, width=width, height=height, hover=("name",), reorderable=False,
                      widths={"name": 640, "kind": 70, "launches": 80, "calls": 80, "device": 110, "share": 70},
                      name=KERNELS_TABLE)
    view.sortable = False  # the rows are a tree: sorting a column would tear kernels from their ops
    shown = len(view.source.data["name"])
    view.source.add(table["first_start_ns"].to_numpy()[:shown], "first_start_ns")
    view.source.add(table["first_dur_ns"].to_numpy()[:shown], "first_dur_ns")
    if x_range is not None:
        spans = timeline.select_one({"name": SPANS_SOURCE}) if timeline is not None else None
        remote = timeline.select_one({"name": REMOTE}) if timeline is not None else None
        view.source.selected.js_on_change("indices", CustomJS(
            code="const remote = timeline_remote ?? {};\n" + _JUMP_TO_ROW,
            args={"rows": view.source, "xr": x_range, "spans": spans or ColumnDataSource(),
                  "timeline_remote": remote}))
    ops = int((~device).sum())
    total = format_duration(int(table.loc[~device, "device_ns"].sum()))
    jumps = "; click a row to jump the timeline to it" if x_range is not None else ""
    heading = Div(render_as_text=True, width=width, text=(
        f"Kernels by launching op, {where}: {ops:,} ops launched {total} of device work (kernels, copies and sets; "
        f"work on several streams at once adds up){rows_note(len(table))}{jumps}"))
    return column(heading, view)


def _range(trace: Trace, window: tuple[int, int] | None) -> tuple[int, int]:
    """The range a call tree covers: `window`, or the whole trace."""
    start = trace.events["start_ns"].to_numpy()
    return resolve_window(start, start + trace.events["dur_ns"].to_numpy(), window)


def _fill(name: str, kind: str) -> str:
    """A box's fill: by kind for the range, threads, annotations and the like, else by a hash of the name."""
    return BOX_COLORS.get(kind) or FLAME_COLORS[zlib.crc32(str(name).encode()) % len(FLAME_COLORS)]
