"""The critical path panel: a step's path as a strip on the timeline's time axis, its share by segment kind, and its
segments and names as tables (`workbench.analysis.critical_path`).

The strip shares the timeline's x-range, so zooming either zooms both and the path lies under the spans it runs
through; selecting a segment jumps the timeline to it. Names from traces render as text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataRange1d, Div, HoverTool, LayoutDOM, NumeralTickFormatter, Range1d
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.analysis.critical_path import SEGMENT_KINDS, CriticalPath, path_summary
from workbench.views._style import time_ticks
from workbench.views._table import data_table, rows_note
from workbench.views.findings import _add_ranges
from workbench.views.text_tables import format_duration

PATH_STRIP = "critical path strip"
"""Bokeh `name` of the strip figure."""
SEGMENTS_TABLE = "critical path segments"
"""Bokeh `name` of the segments DataTable."""

KIND_COLORS = dict(zip(SEGMENT_KINDS, Category10_10, strict=False))
"""One colour per segment kind."""

SEGMENT_COLUMNS = [("start_ms", "at ms", "0,0.000"), ("kind", "kind", None), ("name", "name", None),
                   ("dur_ms", "ms", "0,0.000"), ("share", "share", "0.0%")]
NAME_COLUMNS = [("kind", "kind", None), ("name", "name", None), ("path_ms", "on path ms", "0,0.000"),
                ("share", "of path", "0.0%"), ("device_share", "of device time", "0.0%")]


def critical_path_panel(path: CriticalPath, *, width: int = 1200, x_range: Range1d | None = None) -> LayoutDOM:
    """The panel of one step's path: a heading with the what-if, the strip (on `x_range` when given), the share by
    kind, the names by path share and the segments in time order (selecting one jumps `x_range` to it)."""
    segments = path.segments
    summary = path_summary(path)
    hints = "; ".join(_hint(h) for h in summary["what_if"])
    heading = Div(render_as_text=True, width=width, text=(
        f"Critical path of step {path.step}: {format_duration(path.length_ns)} (the step spans "
        f"{format_duration(path.step_ns)}); {len(segments)} segments. What if: {hints or 'no op or kernel on it'}."
        " Select a segment to jump the timeline to it."))
    if segments.empty:
        return column(heading)
    frame = segments.assign(start_ms=segments["start_ns"] / 1e6, dur_ms=segments["dur_ns"] / 1e6)
    table = data_table(frame, SEGMENT_COLUMNS, width=width, height=320, name=SEGMENTS_TABLE,
                       widths={"start_ms": 90, "kind": 110, "name": 600, "dur_ms": 90, "share": 70})
    shown = frame.head(len(table.source.data["name"]))
    _add_ranges(table.source, list(zip(shown["start_ns"].tolist(), (shown["start_ns"] + shown["dur_ns"]).tolist(),
                                       strict=True)), x_range)
    names = path.by_name().assign(path_ms=lambda t: t["path_ns"] / 1e6)
    return column(heading, _strip(path, width, x_range), row(_by_kind(path, 360), data_table(
        names, NAME_COLUMNS, width=width - 380, height=240, widths={"kind": 100, "name": 480})),
        Div(text=f"Segments in time order{rows_note(len(segments), 'segments')}", render_as_text=True,
            width=width), table)


def _hint(hint: dict) -> str:
    """One what-if of `path_summary` as a sentence."""
    device = "" if hint["device_share"] is None else f"{hint['device_share']:.0%} of device time, "
    return (f"{hint['name'][:100]} ({device}{hint['path_share']:.0%} of the path) {hint['speedup']:g}× faster saves "
            f"{format_duration(hint['saves_ns'])}")


def _strip(path: CriticalPath, width: int, x_range: Range1d | None) -> LayoutDOM:
    """The path's segments as bars along time, one colour per kind, with their names on hover."""
    seg = path.segments
    source = ColumnDataSource({
        "left": seg["start_ns"].to_numpy(dtype=np.float64),
        "right": (seg["start_ns"] + seg["dur_ns"]).to_numpy(dtype=np.float64),
        "kind": seg["kind"].to_numpy(dtype=object), "name": seg["name"].to_numpy(dtype=object),
        "dur": [format_duration(d) for d in seg["dur_ns"].tolist()],
        "color": [KIND_COLORS[k] for k in seg["kind"]],
    })
    extent = Range1d(path.start_ns, path.start_ns + max(path.step_ns, 1))
    fig = figure(width=width, height=90, x_range=x_range if x_range is not None else extent, y_range=(0, 1),
                 tools="xpan,xwheel_zoom,reset", toolbar_location="right", name=PATH_STRIP,
                 title="critical path (on the timeline's axis)")
    bars = fig.quad(left="left", right="right", bottom=0.1, top=0.9, color="color", source=source,
                    line_color=None)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("kind", "@kind"), ("name", "@name"), ("time", "@dur")]))
    fig.xaxis.formatter = time_ticks()
    fig.yaxis.visible = False
    fig.ygrid.visible = False
    return fig


def _by_kind(path: CriticalPath, width: int) -> LayoutDOM:
    """The path's share by segment kind, as horizontal bars."""
    totals = path.segments.groupby("kind")["dur_ns"].sum()
    kinds = [k for k in SEGMENT_KINDS if totals.get(k, 0) > 0]
    shares = pd.Series({k: totals[k] / max(path.length_ns, 1) for k in kinds}, dtype=np.float64)
    fig = figure(width=width, height=240, y_range=list(reversed(kinds)), x_range=DataRange1d(start=0, end=1),
                 toolbar_location=None, title="share of the path by kind")  # a share, not the timeline's time
    source = ColumnDataSource({"kind": kinds, "share": shares.to_numpy(), "color": [KIND_COLORS[k] for k in kinds],
                               "time": [format_duration(int(totals[k])) for k in kinds]})
    bars = fig.hbar(y="kind", right="share", height=0.7, color="color", source=source)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("kind", "@kind"), ("on the path", "@time"),
                                                        ("share", "@share{0.0%}")]))
    fig.xaxis.axis_label = "share of the path"
    fig.xaxis.formatter = NumeralTickFormatter(format="0%")
    return fig
