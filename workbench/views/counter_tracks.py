"""Counter tracks under the timeline: one short figure per track of `workbench.analysis.counter_tracks` (memory
allocated, device busy per stream, server metrics, the trace's counters), all on the timeline's x range so
zooming and panning one moves them all.

Each track is drawn as the area under its step series with the step line on top, and one invisible quad per
point, from its time to the next point's, for the hover (it names the interval and the value there). Its name is
on the left like a lane's, its y axis in its unit (bytes in KiB/MiB/GiB, fractions as %). A checkbox per group
shows or hides the group's tracks. The figures carry `TRACK_PLOT` as their name and their track in `tags`; the
quads' source (`TRACK_SOURCE`) holds `ts_ns`, `end_ns` and `value` as the analysis gave them (the panel's
browser test reads them). `ALIGN` gives the timeline and the tracks the same borders: a time is at one x on all.
"""

from __future__ import annotations

import numpy as np
from bokeh.layouts import column
from bokeh.models import (
    BasicTicker,
    CheckboxGroup,
    ColumnDataSource,
    CustomJS,
    CustomJSTickFormatter,
    Div,
    HoverTool,
    LayoutDOM,
    NumeralTickFormatter,
    PlainText,
    Range,
    Range1d,
)
from bokeh.plotting import figure

from workbench.analysis.counter_tracks import (
    BUSY_GROUP,
    BYTES,
    FRACTION,
    MEMORY_GROUP,
    SERVER_GROUP,
    CounterTrack,
)
from workbench.analysis.counter_tracks import counter_tracks as find_tracks
from workbench.trace import Trace
from workbench.views import timeline_js as js
from workbench.views._style import KIND_COLORS, time_ticks
from workbench.views.memory import BYTES_FORMAT
from workbench.views.timeline import TIMELINE_PLOT

TRACK_PLOT = "counter track"
"""`name` of every track's figure (its `tags[0]` holds the track's group, name and unit)."""
TRACK_SOURCE = "counter track points"
"""`name` of every track's quad source (`ts_ns`, `end_ns`, `value`)."""
GROUP_TOGGLE = "counter track groups"
"""`name` of the checkboxes that show or hide each group's tracks."""
TRACK_HEIGHT = 70
LABEL_CHARS = 36
POINTS_PER_PX = 4
"""Points a series keeps per pixel of the figure's width (its minimum, maximum and last per bin)."""
BINS_PER_PX = 2
"""Busy bins per pixel of the figure's width."""
GROUP_COLORS = {MEMORY_GROUP: KIND_COLORS["memcpy"], BUSY_GROUP: KIND_COLORS["kernel"],
                SERVER_GROUP: KIND_COLORS["annotation"]}
COUNTER_COLOR = KIND_COLORS["op"]
"""The colour of the device counter groups (any group not in `GROUP_COLORS`)."""
_TOOLS = "xpan,xwheel_zoom,reset"

AXIS_FORMATS = {BYTES: BYTES_FORMAT, FRACTION: "0%"}
VALUE_FORMATS = {BYTES: BYTES_FORMAT, FRACTION: "0.0%"}
PLAIN_VALUE_FORMAT = "0,0.[000]"
"""Numbro formats of a unit's axis ticks and hover value. Other units: ticks with SI prefixes (12 k, 3.4 M, 5 G), the
value in full, the unit written after it."""

ALIGN = """
if (typeof Bokeh === "undefined" || Bokeh.index == null) return;
const axis = plots[plots.length - 1];
const doc = axis.document;
if (doc == null) return;
const timeline = [...doc.all_models].find((m) => m.name == timeline_name && m.x_range === axis.x_range);
if (timeline == null) return;
const all = [timeline, ...plots];
const align = () => {
  timeline._wb_align_pending = false;
  if (!Bokeh.documents.includes(doc)) return;  // a document the panel has replaced (a redraw at another width)
  const shown = all.filter((p) => p.visible).map((p) => [p, Bokeh.index.find_one(p)]);
  if (shown.some(([p, v]) => v == null || !v.el.isConnected || !(p.inner_width > 0))) return;
  const left = Math.round(Math.max(...shown.map(([p, v]) => v.frame.bbox.left)));
  const right = Math.round(Math.max(...shown.map(([p, v]) => p.outer_width - v.frame.bbox.right)));
  for (const plot of all)
    if (plot.min_border_left != left || plot.min_border_right != right)
      plot.setv({min_border_left: left, min_border_right: right});
};
// after the layout pass that reported the width, never inside it: changing borders there re-enters the layout
const later = () => {
  if (timeline._wb_align_pending) return;
  timeline._wb_align_pending = true;
  requestAnimationFrame(align);
};
later();
if (!timeline._wb_counter_tracks) {  // the timeline's borders change too (lanes expanded, a redraw)
  timeline._wb_counter_tracks = true;
  timeline.properties.inner_width.change.connect(later);
}
"""
"""Give the timeline and the tracks the widest of their borders, so that a time is at the same x on all."""

_TOGGLE = "for (const [i, figs] of groups.entries()) for (const f of figs) f.visible = cb_obj.active.includes(i);"


def counter_tracks(trace: Trace, *, x_range: Range, width: int) -> LayoutDOM | None:
    """The counter tracks of `trace` on `x_range` (the timeline's: ns from the trace origin), `width` pixels
    wide, under a checkbox per group; None when the trace has no track."""
    found = find_tracks(trace, max_points=POINTS_PER_PX * width, bins=BINS_PER_PX * width)
    if not found.tracks:
        return None
    groups = found.groups
    figures = {group: [] for group in groups}
    for track in found.tracks:
        figures[track.group].append(_track_figure(track, x_range, width))
    counts = {group: len(figs) for group, figs in figures.items()}
    toggle = CheckboxGroup(labels=[_group_label(group, counts[group], found.left_out.get(group, 0))
                                   for group in groups],
                           active=list(range(len(groups))), inline=True, name=GROUP_TOGGLE)
    toggle.js_on_change("active", CustomJS(args={"groups": [figures[g] for g in groups]}, code=_TOGGLE))
    heading = Div(text="Counter tracks (show or hide a group):", render_as_text=True,
                  styles={"font-weight": "bold"})
    plots = [*(fig for group in groups for fig in figures[group]), _time_axis(x_range, width)]
    align = CustomJS(args={"plots": plots, "timeline_name": TIMELINE_PLOT}, code=ALIGN)
    plots[-1].js_on_change("inner_width", align)
    return column(heading, toggle, *plots)


def _group_label(group: str, shown: int, left_out: int) -> str:
    """"memory (2)", or "device busy (16, 4 more left out)"."""
    if not left_out:
        return f"{group} ({shown})"
    return f"{group} ({shown}, {left_out} more left out)"


def _track_figure(track: CounterTrack, x_range: Range, width: int) -> figure:
    """One track: the area under its steps, the step line, its name on the left and its unit on the y axis."""
    points = track.points
    # float64 throughout: BokehJS reads int64 arrays through a slow path that breaks when a redraw reuses them
    source = ColumnDataSource({column: points[column].to_numpy(dtype=np.float64)
                               for column in ("ts_ns", "end_ns", "value")}, name=TRACK_SOURCE)
    values = points["value"].to_numpy(dtype=np.float64)
    finite = values[np.isfinite(values)]
    low = min(float(finite.min()), 0.0) if len(finite) else 0.0
    high = 1.0 if track.unit == FRACTION else (float(finite.max()) if len(finite) else 0.0)
    if high <= low:
        high = low + 1.0
    fig = figure(width=width, height=TRACK_HEIGHT, x_range=x_range, y_range=Range1d(low, high + (high - low) * 0.08),
                 tools=_TOOLS, active_scroll="xwheel_zoom", toolbar_location=None, name=TRACK_PLOT,
                 min_border_top=3, min_border_bottom=3,
                 tags=[{"group": track.group, "track": track.name, "unit": track.unit}])
    color = GROUP_COLORS.get(track.group, COUNTER_COLOR)
    if len(points):
        # the steps need the held end as a point of their own (the intervals below end there already)
        steps = ColumnDataSource({"x": np.append(points["ts_ns"].to_numpy(dtype=np.float64),
                                                 float(points["end_ns"].iloc[-1])),
                                  "y": np.append(values, values[-1])})
        fig.varea_step(x="x", y1=low, y2="y", step_mode="after", source=steps, fill_color=color, fill_alpha=0.35)
        fig.step(x="x", y="y", mode="after", source=steps, line_color=color, line_width=1.5)
    # one quad per interval, drawn only under the pointer: what the hover reads and highlights
    area = fig.quad(left="ts_ns", right="end_ns", bottom=low, top="value", source=source, fill_alpha=0,
                    line_color=None, hover_fill_color=color, hover_fill_alpha=0.5)
    value_format = VALUE_FORMATS.get(track.unit, PLAIN_VALUE_FORMAT)
    suffix = "" if track.unit in VALUE_FORMATS or not track.unit else f" {track.unit}"
    tooltips = [("time", "@ts_ns{custom} to @end_ns{custom}"), ("value", f"@value{{{value_format}}}{suffix}")]
    if track.decimated:
        tooltips.append(("drawn", f"{len(points):,} of {track.total:,} points (each bin's min, max and last)"))
    fig.add_tools(HoverTool(renderers=[area], mode="vline", point_policy="follow_mouse", tooltips=tooltips,
                            formatters={"@ts_ns": js.hover(js.TIME_HOVER), "@end_ns": js.hover(js.TIME_HOVER)}))
    fig.xaxis.visible = False
    fig.xgrid.grid_line_color = None
    fig.yaxis.ticker = BasicTicker(desired_num_ticks=2)
    fig.yaxis.formatter = (NumeralTickFormatter(format=AXIS_FORMATS[track.unit]) if track.unit in AXIS_FORMATS
                           else CustomJSTickFormatter(code=js.FORMAT + "return fmt_si(tick, '');"))
    fig.yaxis.axis_label = PlainText(text=_label(track))  # a name from the trace: never TeX
    fig.yaxis.axis_label_orientation = "horizontal"
    fig.yaxis.axis_label_text_font_size = "10px"
    fig.yaxis.axis_label_text_font_style = "normal"
    fig.yaxis.major_label_text_font_size = "9px"
    return fig


def _label(track: CounterTrack) -> str:
    """The track's name as its lane label (at most `LABEL_CHARS`, cut in the middle), its unit after it where
    the axis does not say it (a plain label such as "tokens/s")."""
    text = track.name if track.unit in (BYTES, FRACTION, "") else f"{track.name} ({track.unit})"
    if len(text) <= LABEL_CHARS:
        return text
    head = (LABEL_CHARS - 1) // 2  # counter names share prefixes and differ at the end: keep both
    return text[:head] + "…" + text[len(text) - (LABEL_CHARS - 1 - head):]


def _time_axis(x_range: Range, width: int) -> figure:
    """The time axis under the tracks (theirs are hidden, so hiding a group never hides it)."""
    fig = figure(width=width, height=52, x_range=x_range, y_range=Range1d(0, 1), tools=_TOOLS,
                 active_scroll="xwheel_zoom", toolbar_location=None, min_border_top=0, min_border_bottom=2)
    fig.scatter(x=[], y=[])  # nothing to draw: a glyph only so that Bokeh does not warn of a plot without one
    fig.xaxis.formatter = time_ticks()
    fig.xaxis.axis_label = "time from trace start"
    fig.yaxis.visible = False
    fig.grid.grid_line_color = None
    fig.outline_line_color = None
    return fig
