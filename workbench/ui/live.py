"""Live level of detail for a dashboard shown in a kernel: the timeline's spans follow the zoom.

A static dashboard embeds the real spans of some windows and density bars elsewhere (see
`workbench.views.timeline`). Shown through jupyter_bokeh, its x-range changes reach Python, so
`follow_zoom`'s callback answers each settled view with `workbench.analysis.spans.queries.window` (the function the
Jupyter server's `spans` route sends) and writes the reply into the timeline's `REMOTE` source; the
browser applies it with the same code that applies the server's replies in the Lab panel. One
implementation, two transports.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from bokeh.core.property.descriptors import UnsetValueError
from bokeh.models import ColumnDataSource, LayoutDOM, Plot, Range1d

from workbench.analysis.spans.queries import MAX_SPANS, RunRef, window
from workbench.views.timeline import REMOTE, TIMELINE_PLOT

RangeCallback = Callable[[str, object, object], None]
MAX_WIDTH_PX = 20_000
"""Widest window asked for, in pixels (as the server allows)."""


def follow_zoom(layout: LayoutDOM, run: RunRef, max_spans: int = MAX_SPANS) -> RangeCallback | None:
    """Make the timeline in `layout` (a dashboard of `run`: a Bundle or a bundle folder) take the spans of
    each new view from Python; returns the callback attached to its x-range, or None when the layout has no
    timeline.

    Each view is asked for with half a view more on each side, at two pixels per screen pixel, so small
    pans and a first zoom step need nothing new. A view inside the last one asked for needs no request
    when that reply was all spans, or when it is at most three views wide (its density still fine
    enough).
    """
    remote = layout.select_one({"name": REMOTE})
    plot = layout.select_one({"name": TIMELINE_PLOT})
    if not isinstance(remote, ColumnDataSource) or not isinstance(plot, Plot) or not isinstance(plot.x_range, Range1d):
        return None
    x_range = plot.x_range
    shown: dict[str, int | bool] = {}

    def on_range(_attr: str, _old: object, _new: object) -> None:
        start, end = math.floor(x_range.start), math.ceil(x_range.end)
        width = end - start
        if width <= 0:
            return
        if shown and shown["start"] <= start and end <= shown["end"] and (
                shown["complete"] or shown["end"] - shown["start"] <= 3 * width):
            return
        pixels = min(2 * _screen_width(plot), MAX_WIDTH_PX)
        reply = window(run, start - width // 2, end + width - width // 2, pixels, max_spans=max_spans)
        shown.update(start=reply["start_ns"], end=reply["end_ns"],
                     complete=all(lane["mode"] == "spans" for lane in reply["lanes"]))
        remote.tags = [reply]

    x_range.on_change("start", on_range)
    x_range.on_change("end", on_range)
    return on_range


def _screen_width(plot: Plot) -> int:
    """The plot's drawing width in pixels as the browser last reported it, else its configured width."""
    try:
        inner = plot.inner_width  # set by the browser once the plot is drawn
    except UnsetValueError:
        inner = None
    return max(int(inner or plot.width or 1), 1)
