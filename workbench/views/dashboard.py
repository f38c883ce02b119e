"""The dashboard of one run: timeline, memory map and op/kernel tables, linked.

The timeline and the memory map share one x-range (zooming one zooms the other); selecting rows of
the op or kernel table selects those names' spans in the timeline, and selecting a kernel there
selects the op that launched it (the timeline's own link).
"""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import DataTable, Div, LayoutDOM, Range1d, TabPanel, Tabs

from workbench.analysis.breakdown import phase_window
from workbench.analysis.summary import display_name
from workbench.analysis.timeline import count_spans
from workbench.trace.bundle import Bundle
from workbench.views.memory import memory_map
from workbench.views.tables import link_table_to_timeline, op_table_view
from workbench.views.timeline import SPANS_SOURCE, timeline


def dashboard(bundle: Bundle, *, width: int = 1200, max_spans: int = 20_000) -> LayoutDOM:
    """The linked views of one run (a note in place of the views when the run has no trace)."""
    info = bundle.info
    title = " · ".join(str(part) for part in (
        bundle.run_id, display_name(info.get("model")), display_name(info.get("variant")), info.get("device"),
    ) if part)
    heading = Div(text=title, render_as_text=True, styles={"font-weight": "bold", "font-size": "14px"})
    if not bundle.has_trace:
        reason = info.get("error") or "it was captured without a profiler (--no-profile)"
        return column(heading, Div(text=f"No trace in this run: {reason}", render_as_text=True, width=width))
    trace = bundle.trace()
    events = trace.events
    first = int(events["start_ns"].to_numpy().min()) if events.num_rows else 0
    last = int((events["start_ns"].to_numpy() + events["dur_ns"].to_numpy()).max()) if events.num_rows else 1
    pad = max((last - first) * 0.01, 1)
    window = phase_window(trace, "measure")
    # A capture opens on its steady state (the measured steps); reset and zooming out reach the rest.
    start, end = (window[0], window[1]) if window else (first, last)
    margin = max((end - start) * 0.02, 1)
    shown = (int(start - margin), int(end + margin))
    x_range = Range1d(*shown, bounds=(first - pad, last + pad))
    time_view = timeline(trace, x_range=x_range, width=width, max_spans=max_spans,
                         detail=shown if window and _fits(trace, shown, max_spans) else None)
    ops = op_table_view(trace, ("op",), window, width=width, height=320)
    kernels = op_table_view(trace, ("kernel",), window, width=width, height=320)
    spans = time_view.select_one({"name": SPANS_SOURCE})  # None when the timeline is a note
    for table_view in (ops, kernels):
        table = table_view.select_one({"type": DataTable})  # None when the table is a note
        if spans is not None and table is not None:
            link_table_to_timeline(table.source, spans)
    tabs = Tabs(tabs=[TabPanel(child=ops, title="ops"), TabPanel(child=kernels, title="kernels"),
                      TabPanel(child=memory_map(trace, x_range=x_range, width=width), title="memory")])
    return column(heading, time_view, tabs)


def _fits(trace, window: tuple[int, int], max_spans: int) -> bool:
    """Whether the real spans of `window` can all be embedded."""
    return count_spans(trace, window) <= max_spans
