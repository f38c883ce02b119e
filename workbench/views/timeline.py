"""The op timeline: one lane per track, spans coloured by kind, nested by depth, with level of detail.

Lanes come grouped by device (each accelerator's streams or cores, then the host threads), labelled for people
(`views.timeline_lanes`); inside a lane each nesting depth has its own row, and a device lane is at least
`DEVICE_LANE_ROWS` high. A click on a lane's label collapses it to one row or expands it back
(`views.timeline_js.COLLAPSE`). Step and phase annotations are translucent bands across all lanes, with a strip
above the lanes to hover and click (a click zooms to that step). Wheel zoom and pan are on by default and stay
on; W/S zoom and A/D pan while the pointer is over the plot, as in Perfetto. Names are drawn inside the spans
wide enough to hold them. Clicking a span (or a search or a jump landing on one) makes it the focus: it is
selected with its launcher or launched kernels, outlined with a marker at its start (`FOCUS`, `MARKER`), fills
the details sources (`DETAILS`, with a kernel's launch facts; `RELATED`: the dashboard's details pane shows
them) and draws flow arrows from a launch to its kernels. A range selected with the x box select fills
`AGGREGATE` (count, total and self time per name).

Large traces: the figure embeds (a) precomputed density levels (`workbench.analysis.timeline.density`)
and (b) the real spans of some windows holding at most `max_spans` events, never the whole trace, so a
static report stays small whatever the event count. While the visible time range lies inside a window
the real spans are drawn; elsewhere the density level whose bins are no wider than a pixel is, and a line
above the plot says so. In the Lab panel the server answers the spans of any window (`REMOTE`, see
`views.timeline_js`); in a notebook the kernel does (`workbench.ui.live`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from bokeh import events
from bokeh.models import (
    Arrow,
    BoxSelectTool,
    BoxZoomTool,
    ColumnDataSource,
    CustomJS,
    Div,
    FixedTicker,
    GlyphRenderer,
    HoverTool,
    Legend,
    LegendItem,
    PanTool,
    Range1d,
    ResetTool,
    SaveTool,
    Span,
    TapTool,
    Title,
    VeeHead,
    WheelZoomTool,
)
from bokeh.models.layouts import LayoutDOM
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from workbench.analysis.launch_facts import FIELDS as LAUNCH_FIELDS
from workbench.analysis.launch_facts import events_launch_facts, facts_text
from workbench.analysis.timeline import (
    count_spans,
    density,
    detail_window,
    lanes,
    phases,
    spans,
)
from workbench.trace import Trace
from workbench.trace.schema import KINDS
from workbench.views import timeline_js as js
from workbench.views import timeline_select_js as select_js
from workbench.views._style import KIND_COLORS, KIND_PALETTE, PHASE_BAND_COLOR, STEP_BAND_COLORS, time_ticks
from workbench.views.timeline_density import draw_density, draw_remote_density, set_initial_mode
from workbench.views.timeline_lanes import lane_names

SPANS_SOURCE = "timeline spans"
"""`name` of the timeline's span source, so a layout holding the timeline can find it to link to."""
TIMELINE_PLOT = "timeline"
"""`name` of the timeline figure (the Lab panel finds its x-range by it to keep the zoom across redraws)."""
REMOTE = "timeline remote"
"""`name` of the source whose `tags` take a `spans` reply (docs/api-spans.md) and that carries the panel's API."""
DETAILS, RELATED, AGGREGATE, WINDOWS = "timeline details", "timeline related", "timeline aggregate", "timeline windows"
"""`name`s of the sources of the details pane, the clicked event's related events, the range aggregate and the
windows with real spans."""
AGGREGATE_INFO = "timeline aggregate info"
"""`name` of the Div saying what the range aggregate covers."""
FOCUS, MARKER, LANES = "timeline focus", "timeline focus marker", "timeline lanes"
"""`name`s of the outline of the focused span (the one the details pane shows), of the vertical marker at its start,
and of the source of the lanes drawn (lane, device, rows, text, collapsed: `views.timeline_js.RELAYOUT` places them)."""
FOCUS_COLOR = "#ff7f0e"
"""Colour of the focused span's outline and marker (no kind is drawn in it)."""
FOLDED = "folded lanes"
"""Key of the figure's `tags[0]` listing its folded lanes (lane, device, label, tracks), for the lane expander."""
LANE_GAP = 0.5
"""Rows of space between two lanes (twice that between devices)."""
DEVICE_LANE_ROWS = 2.0
"""Height (in rows) a device lane takes at least: a stream's kernels never nest, and one thin row of them would
be the least readable lane of the timeline. Its rows are taller instead (`unit`, see `_lane_layout`)."""
MAX_HEIGHT_PX, TALL_HEIGHT_PX = 1000, 2400
"""Tallest figure by default (`_height`: a big trace stays on one screen), and once a folded lane is expanded into
its tracks (the page scrolls, and each lane stays readable)."""
ROW_PX = 16
"""Screen height of one nesting row at the default figure height."""
SHAPES_CHARS = 200
"""Input shapes longer than this are cut in the tooltip (some ops record thousands of characters)."""
INSTANT_PX = 9
"""Marker size of an instant (a 0 ns event), which has no width to draw."""
LABEL_FONT_PX, LABEL_CHAR_PX, LABEL_PAD_PX, MAX_LABELS = 10, 6.2, 6, 2_000
"""Names inside spans: font size, the width of a character, the room left around a name, the most drawn."""

_SPAN_KEYS = ("left", "right", "y", "h", "lane", "depth", "instant_px", "dur_ns", "name", "kind", "shapes", "flops",
              "row", "launcher_idx", "launcher_name", "launched", "parent_idx", "launch")
"""Columns of the span source (see `_span_columns`; `views.timeline_js.APPLY_REPLY` writes the same)."""

Window = tuple[int, int, str]
"""A window [start, end) ns whose real spans are embedded, and its label."""


def timeline(trace: Trace, *, x_range: Range1d | None = None, width: int = 1200, max_spans: int = 20_000,
             detail: tuple[int, int] | None = None, windows: list[Window] | None = None, bins: int = 2048,
             levels: int = 4) -> LayoutDOM:
    """The op timeline of `trace` as a Bokeh figure (a note when the trace has no events).

    `x_range` (ns from the trace origin) may be shared with other views to link their zoom; by default one
    spanning the trace. `windows` are the windows whose real spans are embedded (a report's plan); else
    `detail` ([start, end) ns), else the longest one from the first step holding at most `max_spans` events
    (the whole trace when it has no more). Outside them the view shows `levels` density levels of `bins`,
    2·`bins`, ... bins.
    """
    if trace.events.num_rows == 0:
        return Div(text="No events in this trace: nothing to draw on the timeline.", render_as_text=True)
    lane_table = lanes(trace)
    layout = _lane_layout(lane_table)
    bands = phases(trace)
    lod = density(trace, bins=bins, levels=levels, lane_table=lane_table)
    first, last = lod.origin_ns, lod.origin_ns + lod.span_ns
    pad = (last - first) * 0.01
    if x_range is None:
        x_range = Range1d(first - pad, last + pad, bounds=(first - pad, last + pad))
    if windows is None:
        window = detail_window(trace, max_spans) if detail is None else detail
        windows = [(int(window[0]), int(window[1]), "")]
    source = ColumnDataSource(data={}, name=SPANS_SOURCE)
    _fill(trace, source, [(start, end) for start, end, _ in windows], lane_table)
    strip = _strip_rows(bands)
    pan, wheel = PanTool(dimensions="width"), WheelZoomTool(dimensions="width")
    box_zoom, box_select = BoxZoomTool(dimensions="width"), BoxSelectTool(dimensions="width")
    fig = figure(width=width, height=_height(layout, strip), x_range=x_range, name=TIMELINE_PLOT,
                 y_range=Range1d(float(layout["bottom"].max()) + LANE_GAP, -strip - LANE_GAP),
                 tools=[pan, wheel, box_zoom, box_select, ResetTool(), SaveTool()], active_drag=pan,
                 active_scroll=wheel, title=_title(trace, lane_table))
    _keep_active(pan, [box_zoom, box_select])
    _keep_active(wheel, [])
    band_renderers, band_fill = _draw_bands(fig, bands, layout, x_range)
    level_renderers = draw_density(fig, lod, layout)
    remote = ColumnDataSource(data={}, name=REMOTE)
    remote_bars = draw_remote_density(fig)
    span_renderers = _draw_spans(fig, source)
    box_select.renderers = span_renderers[:1]
    window_source = ColumnDataSource({"left": [float(w[0]) for w in windows], "right": [float(w[1]) for w in windows],
                                      "label": [w[2] for w in windows]}, name=WINDOWS)
    boxes = fig.quad(left="left", right="right", top=float(layout["bottom"].max()), bottom=0, source=window_source,
                     fill_alpha=0, line_color="black", line_dash="dashed", line_alpha=0.6)
    fig.add_tools(TapTool(renderers=[*span_renderers, *band_renderers]))
    focus, marker = _draw_focus(fig)
    status = Title(text="", text_font_style="italic", text_font_size="11px")
    fig.add_layout(status, "above")
    set_initial_mode(source, lod, span_renderers, level_renderers, boxes, status, x_range, (first, last), width)
    lod_callback = CustomJS(args={"xr": x_range, "source": source, "spans": span_renderers, "levels": level_renderers,
                                  "bin_ns": [lod.bin_ns(level) for level in range(len(lod.bins))],
                                  "status": status, "boxes": boxes, "plot": fig, "width": width,
                                  "extent": [first, last], "remote": remote, "remote_bars": remote_bars}, code=js.LOD)
    labels_callback = _draw_labels(fig, source, span_renderers[0], x_range, width)
    request = CustomJS(args={"xr": x_range, "source": source, "remote": remote, "plot": fig, "plot_width": width,
                             "status": status}, code=js.REQUEST)
    for callback in (lod_callback, labels_callback, request):
        x_range.js_on_change("start", callback)
        x_range.js_on_change("end", callback)
    fig.js_on_change("inner_width", labels_callback)
    source.js_on_change("tags", lod_callback)
    source.js_on_change("tags", labels_callback)  # after the LOD code has shown or hidden the spans
    source.js_on_change("data", labels_callback)
    names = lane_names(trace, lane_table)
    separators = _style_axes(fig, layout, names)
    lane_text = [f"{device} · {name}" for device, name in zip(layout["device"], names, strict=True)]
    lane_source = ColumnDataSource({"lane": layout["lane"].tolist(), "device": layout["device"].tolist(),
                                    "rows": layout["depth_rows"].tolist(), "text": lane_text,
                                    "collapsed": [False] * len(layout)}, name=LANES)
    placing = {"lanes": lane_source, "source": source, "levels": level_renderers, "remote_bars": remote_bars,
               "yaxis": fig.yaxis[0], "separators": separators, "bottoms": band_fill, "tops": [boxes],
               "plot": fig, "lane_gap": LANE_GAP, "row_px": ROW_PX, "strip": strip, "device_rows": DEVICE_LANE_ROWS,
               "max_px": MAX_HEIGHT_PX, "tall_px": TALL_HEIGHT_PX, "lane_text": lane_text}
    remote.js_on_change("tags", CustomJS(code=js.APPLY_REPLY, args={
        **placing, "remote": remote, "instant_px": INSTANT_PX, "all_kinds": list(KINDS)}))
    fig.js_on_event(events.Tap, CustomJS(code=js.COLLAPSE, args={**placing, "what": None}, name=js.COLLAPSE_CALLBACK))
    remote.js_on_change("tags", request)  # the panel sets empty tags once it has installed its API
    _link_selection(fig, source, remote, x_range, names, focus, marker)
    _aggregate_on_range(fig, source, remote)
    keys = CustomJS(args={"xr": x_range, "plot": fig}, code=js.KEYS)
    for event in (events.MouseEnter, events.MouseLeave, events.MouseMove):
        fig.js_on_event(event, keys)
    folded = lane_table[lane_table["tracks"] > 1]
    fig.tags = [{FOLDED: [{"lane": int(lane), "device": str(device), "label": str(label), "tracks": int(tracks)}
                          for lane, device, label, tracks in folded[["lane", "device", "label", "tracks"]].itertuples(
                              index=False)]}]
    _add_legend(fig, trace)
    return fig


def refine(trace: Trace, source: ColumnDataSource, start_ns: int, end_ns: int, *, max_spans: int = 20_000,
           lane_table: pd.DataFrame | None = None) -> int:
    """Fill the timeline's span `source` with the real spans of [start_ns, end_ns); return their count.

    When the window holds more than `max_spans` events the source is emptied instead and the view keeps
    showing density bars for it. `source.tags` records the window the spans cover (empty when none).
    """
    lane_table = lanes(trace) if lane_table is None else lane_table
    count = count_spans(trace, (start_ns, end_ns))
    if count > max_spans:
        source.data, source.tags = {key: [] for key in _SPAN_KEYS}, []
        return count
    _fill(trace, source, [(start_ns, end_ns)], lane_table)
    return count


def _fill(trace: Trace, source: ColumnDataSource, windows: list[tuple[int, int]], lane_table: pd.DataFrame) -> None:
    """Fill `source` with the real spans of `windows` (each event once); `tags` lists their bounds."""
    layout = _lane_layout(lane_table)
    tables = [spans(trace, (start, end), lane_table) for start, end in windows]
    table = pd.concat(tables, ignore_index=True).drop_duplicates("row").sort_values("row", kind="stable")
    source.data = _span_columns(trace, table.reset_index(drop=True), layout)
    source.tags = [int(bound) for window in windows for bound in window]


def _title(trace: Trace, lane_table: pd.DataFrame) -> str:
    """The figure's title: events and lanes, and how many tracks the lanes stand for when some are folded."""
    title = f"Timeline: {trace.events.num_rows:,} events in {len(lane_table)} lanes"
    tracks = int(lane_table["tracks"].sum())
    if tracks > len(lane_table):
        title += f' ({tracks:,} tracks: the quietest are folded into the "more" lanes)'
    return title


def _keep_active(tool: PanTool | WheelZoomTool, others: list) -> None:
    """Switch `tool` back on when a click on its button leaves no tool of its kind active."""
    tool.js_on_change("change:active", CustomJS(args={"others": others}, code=js.KEEP_ACTIVE))


def _draw_labels(fig: figure, source: ColumnDataSource, bars: GlyphRenderer, x_range: Range1d,
                 width: int) -> CustomJS:
    """The names inside spans (a text glyph the browser refills on every zoom); returns the refill callback."""
    labels = ColumnDataSource({"x": [], "y": [], "text": [], "color": []})
    fig.text(x="x", y="y", text="text", source=labels, text_align="center", text_baseline="middle",
             text_font_size=f"{LABEL_FONT_PX}px", text_color="color")
    ink = {kind: _ink(color) for kind, color in KIND_COLORS.items()}
    return CustomJS(args={"source": source, "labels": labels, "bars": bars, "xr": x_range, "plot": fig,
                          "width": width, "ink": ink, "char_px": LABEL_CHAR_PX, "pad": LABEL_PAD_PX,
                          "max_labels": MAX_LABELS}, code=js.LABELS)


def _ink(color: str) -> str:
    """Black or white, whichever reads better on `color` (#rrggbb)."""
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"


def _link_selection(fig: figure, source: ColumnDataSource, remote: ColumnDataSource, x_range: Range1d,
                    names: list[str], focus: ColumnDataSource, marker: Span) -> None:
    """Selection links launches and kernels, fills the details sources and draws the flow arrows."""
    details = ColumnDataSource({"field": [], "value": []}, name=DETAILS)
    related = ColumnDataSource({key: [] for key in ("relation", "name", "start", "duration", "start_ns", "dur_ns",
                                                    "index", "row")}, name=RELATED)
    arrows = ColumnDataSource({"x0": [], "y0": [], "x1": [], "y1": []})
    fig.add_layout(Arrow(end=VeeHead(size=8, fill_color="black"), x_start="x0", y_start="y0", x_end="x1",
                         y_end="y1", source=arrows, line_color="black", line_width=1.5))
    source.selected.js_on_change("indices", CustomJS(code=select_js.SELECT, args={
        "source": source, "details": details, "related": related, "arrows": arrows, "remote": remote,
        "lane_names": names, "focus": focus, "marker": marker, "launch_fields": list(LAUNCH_FIELDS)}))
    related.selected.js_on_change("indices", CustomJS(code=select_js.FOLLOW_RELATED, args={
        "related": related, "source": source, "xr": x_range, "remote": remote, "details": details,
        "marker": marker}))


def _draw_focus(fig: figure) -> tuple[ColumnDataSource, Span]:
    """The focused span's outline (a ring at its start too, so that a span narrower than a pixel, or an instant,
    stands out) and a vertical marker at its start across all lanes; `views.timeline_select_js.SELECT` moves them."""
    focus = ColumnDataSource({"x": [], "left": [], "right": [], "y": [], "h": []}, name=FOCUS)
    fig.hbar(y="y", left="left", right="right", height="h", source=focus, fill_alpha=0, line_color=FOCUS_COLOR,
             line_width=3)
    fig.scatter(x="x", y="y", source=focus, marker="circle", size=16, fill_alpha=0, line_color=FOCUS_COLOR,
                line_width=2.5)
    marker = Span(location=None, dimension="height", line_color=FOCUS_COLOR, line_width=1.5, line_dash="dashed",
                  visible=False, name=MARKER)
    fig.add_layout(marker)
    return focus, marker


def _aggregate_on_range(fig: figure, source: ColumnDataSource, remote: ColumnDataSource) -> None:
    """A range selected with the x box select fills the `AGGREGATE` source (per name: count, total, self)."""
    table = ColumnDataSource({"name": [], "kind": [], "count": [], "total_ms": [], "self_ms": []}, name=AGGREGATE)
    info = Div(text="Select a range with the box select tool (x) for the time per name inside it.",
               render_as_text=True, name=AGGREGATE_INFO)
    fig.js_on_event(events.SelectionGeometry, CustomJS(code=js.AGGREGATE, args={
        "source": source, "remote": remote, "table": table, "info": info}))


def _lane_layout(lane_table: pd.DataFrame) -> pd.DataFrame:
    """Vertical placement of each lane (y grows downwards):
    | lane | device | label | top | depth_rows | unit | rows | bottom | new_device |.

    A lane has a row per nesting depth (`depth_rows`), each `unit` high: 1, but a device lane is at least
    `DEVICE_LANE_ROWS` high. `rows` is its height in rows (`depth_rows · unit`). `views.timeline_js.RELAYOUT`
    places lanes the same way in the browser (with collapsed lanes one row)."""
    depth_rows = lane_table["max_depth"].to_numpy() + 1
    devices = lane_table["device"].to_numpy()
    unit = np.where(devices == "cpu", 1.0, np.maximum(1.0, DEVICE_LANE_ROWS / depth_rows))
    rows = depth_rows * unit
    new_device = np.r_[False, devices[1:] != devices[:-1]]
    gaps = np.where(new_device, 2 * LANE_GAP, LANE_GAP)
    gaps[0] = 0
    top = np.cumsum(gaps + np.r_[0, rows[:-1]])
    return pd.DataFrame({"lane": lane_table["lane"], "device": lane_table["device"], "label": lane_table["label"],
                         "top": top.astype(float), "depth_rows": depth_rows, "unit": unit, "rows": rows,
                         "bottom": (top + rows).astype(float), "new_device": new_device})


def _span_columns(trace: Trace, table: pd.DataFrame, layout: pd.DataFrame) -> dict[str, object]:
    """The span source's columns for the `spans` table of a window."""
    placed = layout.set_index("lane")
    top, unit = placed["top"].reindex(table["lane"]).to_numpy(), placed["unit"].reindex(table["lane"]).to_numpy()
    position = pd.Series(np.arange(len(table)), index=table["row"].to_numpy())
    launcher = table["launcher"].to_numpy()
    linked = launcher >= 0
    launcher_name = np.full(len(table), "", dtype=object)
    launcher_name[linked] = trace.events["name"].take(pa.array(launcher[linked])).cast(pa.string()).to_pylist()
    parent = trace.events["parent"].take(pa.array(table["row"].to_numpy(), type=pa.int64())).to_numpy()
    return {
        "left": table["start_ns"].to_numpy(dtype=np.float64),
        "right": table["end_ns"].to_numpy(dtype=np.float64),
        "y": (top + (table["depth"].to_numpy() + 0.5) * unit).astype(np.float32),
        "h": (0.8 * unit).astype(np.float32),
        "lane": table["lane"].to_numpy(dtype=np.int32),
        "depth": table["depth"].to_numpy(dtype=np.int32),
        "instant_px": np.where(table["dur_ns"].to_numpy() == 0, INSTANT_PX, 0).astype(np.uint8),
        "dur_ns": table["dur_ns"].to_numpy(dtype=np.float64),
        "name": table["name"].to_numpy(dtype=object),
        "kind": table["kind"].to_numpy(dtype=object),
        "shapes": np.array([_clip(s, SHAPES_CHARS) for s in table["shapes"]], dtype=object),
        "flops": table["flops"].to_numpy(dtype=np.float64),
        "row": table["row"].to_numpy(dtype=np.int32),
        "launcher_idx": position.reindex(launcher).fillna(-1).to_numpy(dtype=np.int32),
        "launcher_name": launcher_name,
        "launched": table["launched"].to_numpy(dtype=np.int32),
        "parent_idx": position.reindex(parent).fillna(-1).to_numpy(dtype=np.int32),
        "launch": np.array([facts_text(facts) for facts in events_launch_facts(trace.events, table["row"].to_numpy())],
                           dtype=object),
    }


def _strip_rows(bands: pd.DataFrame) -> int:
    """Rows of the band strip above the lanes: one per tier present (phases, steps)."""
    return int(bands["tier"].nunique())


def _height(layout: pd.DataFrame, strip: int) -> int:
    """Figure height in px: `ROW_PX` per row, within bounds that keep big traces on one screen."""
    rows = float(layout["bottom"].max()) + strip + 2 * LANE_GAP
    return int(min(max(rows * ROW_PX + 140, 240), MAX_HEIGHT_PX))


def _draw_bands(fig: figure, bands: pd.DataFrame, layout: pd.DataFrame,
                x_range: Range1d) -> tuple[list[GlyphRenderer], list[GlyphRenderer]]:
    """Translucent step/phase bands across all lanes and the clickable strip above them: (the strip, the bands)."""
    if bands.empty:
        return [], []
    tiers = sorted(bands["tier"].unique())
    row = bands["tier"].map({tier: i for i, tier in enumerate(tiers)}).to_numpy()
    step_index = bands.groupby("tier").cumcount().to_numpy()
    color = np.where(bands["tier"].to_numpy() == 0, PHASE_BAND_COLOR,
                     np.array(STEP_BAND_COLORS, dtype=object)[step_index % 2])
    source = ColumnDataSource({
        "left": bands["start_ns"].to_numpy(dtype=np.float64),
        "right": bands["end_ns"].to_numpy(dtype=np.float64),
        "name": bands["name"].to_numpy(dtype=object),
        "dur_ms": (bands["end_ns"] - bands["start_ns"]).to_numpy() / 1e6,
        "color": color,
        "strip_top": row - len(tiers) + 0.05,
        "strip_bottom": row - len(tiers) + 0.95,
    })
    fill = fig.quad(left="left", right="right", top=0, bottom=float(layout["bottom"].max()), source=source,
                    fill_color="color", fill_alpha=0.18, line_color=None, selection_fill_alpha=0.3,
                    nonselection_fill_alpha=0.18)
    strip = fig.quad(left="left", right="right", top="strip_top", bottom="strip_bottom", source=source,
                     fill_color="color", line_color="white", fill_alpha=0.9, nonselection_fill_alpha=0.9)
    fig.add_tools(HoverTool(renderers=[strip], tooltips=[("", "@name"), ("duration", "@dur_ms{0,0.000} ms"),
                                                         ("", "click to zoom to it")]))
    source.selected.js_on_change("indices", CustomJS(args={"xr": x_range, "bands": source}, code=js.ZOOM_TO_BAND))
    return [strip], [fill]


def _draw_spans(fig: figure, source: ColumnDataSource) -> list[GlyphRenderer]:
    """Real spans as bars in their lane's row for their depth, coloured by kind; instants as diamonds."""
    color = factor_cmap("kind", list(KIND_PALETTE), list(KINDS))
    bars = fig.hbar(y="y", left="left", right="right", height="h", source=source, fill_color=color, line_color=None,
                    nonselection_fill_alpha=0.35, selection_line_color="black")
    instants = fig.scatter(x="left", y="y", size="instant_px", marker="diamond", source=source, fill_color=color,
                           line_color=None, nonselection_fill_alpha=0.35)
    fig.add_tools(HoverTool(renderers=[bars, instants], tooltips=[
        ("name", "@name"), ("kind", "@kind"), ("duration", "@dur_ns{time}"), ("start", "@left{time}"),
        ("shapes", "@shapes"), ("flops", "@row{flops}"), ("launched by", "@launcher_name"),
        ("launches", "@launched{count} device events")],
        formatters={"@dur_ns": js.hover(js.TIME_HOVER), "@left": js.hover(js.TIME_HOVER),
                    "@row": js.hover(js.FLOPS_HOVER, source=source), "@launched": js.hover(js.COUNT_HOVER)}))
    return [bars, instants]


def _style_axes(fig: figure, layout: pd.DataFrame, names: list[str]) -> list[Span]:
    """Time axis below; one label per lane ("device · name", `names` from `lane_names`; "▾ " before it for a lane of
    several rows: a click on it collapses the lane), a rule between devices (returned)."""
    fig.xaxis.formatter = time_ticks()
    fig.xaxis.axis_label = "time from trace start"
    centers = (layout["top"] + layout["rows"] / 2).to_list()
    fig.yaxis.ticker = FixedTicker(ticks=centers)
    fig.yaxis.major_label_overrides = {center: ("▾ " if rows > 1 else "") + f"{device} · {name}" for
                                       center, device, name, rows
                                       in zip(centers, layout["device"], names, layout["depth_rows"], strict=True)}
    fig.yaxis.major_tick_line_color = None
    fig.ygrid.grid_line_color = None
    rules = [Span(location=top - LANE_GAP, dimension="width", line_color="gray", line_alpha=0.6)
             for top in layout.loc[layout["new_device"], "top"]]
    for rule in rules:
        fig.add_layout(rule)
    return rules


def _add_legend(fig: figure, trace: Trace) -> None:
    """A legend of the kinds in the trace (glyphs that draw nothing: the spans and bars share these colours)."""
    present = trace.kind_counts()
    items = []
    for kind in KINDS:
        if present.get(kind):
            swatch = fig.quad(left=[np.nan], right=[np.nan], top=[np.nan], bottom=[np.nan],
                              fill_color=KIND_COLORS[kind], line_color=None)
            items.append(LegendItem(label=kind, renderers=[swatch]))
    fig.add_layout(Legend(items=items, title="kind"), "right")


def _clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"
