"""Live level of detail for a dashboard shown in a kernel: the timeline's real spans follow the zoom.

A static dashboard embeds the real spans of one detail window and density bars elsewhere (see
`workbench.views.timeline`). Shown through jupyter_bokeh, its x-range changes reach Python, so when the
visible window leaves the embedded one, `follow_zoom`'s callback refills the span source for it with
`workbench.views.timeline.refine` (when it holds few enough events); the browser then draws the spans.
"""

from __future__ import annotations

from collections.abc import Callable

from bokeh.models import ColumnDataSource, LayoutDOM, Plot, Range1d

from workbench.analysis.timeline import count_spans, lanes
from workbench.trace import Trace
from workbench.views.timeline import SPANS_SOURCE, refine

RangeCallback = Callable[[str, object, object], None]


def follow_zoom(layout: LayoutDOM, trace: Trace, max_spans: int = 20_000) -> RangeCallback | None:
    """Make the timeline in `layout` (a dashboard of `trace`) refine its spans from Python as its x-range
    moves; returns the callback attached to the range, or None when the layout has no timeline.

    The window refined is the visible one widened by its own width on each side (so small pans need no
    new spans), or just the visible one when the wider one holds more than `max_spans` events; when even
    that holds more, the spans already embedded stay and the view keeps its density bars.
    """
    source = layout.select_one({"name": SPANS_SOURCE})
    if not isinstance(source, ColumnDataSource):
        return None
    plot = next((p for p in layout.select({"type": Plot})
                 if any(getattr(r, "data_source", None) is source for r in p.renderers)), None)
    if plot is None or not isinstance(plot.x_range, Range1d):
        return None
    x_range = plot.x_range
    lane_table = lanes(trace)

    def on_range(_attr: str, _old: object, _new: object) -> None:
        start, end = int(x_range.start), int(x_range.end)
        if end <= start:
            return
        tags = source.tags
        if len(tags) == 2 and tags[0] <= start and end <= tags[1]:
            return  # the spans already cover the view
        width = end - start
        for window in ((start - width, end + width), (start, end)):
            if count_spans(trace, window) <= max_spans:
                refine(trace, source, *window, max_spans=max_spans, lane_table=lane_table)
                return

    x_range.on_change("start", on_range)
    x_range.on_change("end", on_range)
    return on_range
