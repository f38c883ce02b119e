"""The dashboard of one run: timeline with its counter tracks, op/kernel tables, call tree, memory map, roofline and
findings, linked.

The timeline, its counter tracks (memory, device busy per stream, the trace's counters, serving metrics) and the
memory map share one x-range (zooming one zooms the others); the call tree's flame graph and its "kernels by
launching op" table jump the timeline to what is clicked; selecting rows of
the op or kernel table selects those names' spans in the timeline, and selecting a kernel there
selects the op that launched it (the timeline's own link). Selecting roofline points selects their
names in the tables and the timeline. The critical path tab draws a typical step's path on the timeline's axis and
jumps the timeline to a selected segment. The roofline and findings tabs show what `workbench analyze RUN`
prints (`analysis.bottlenecks.analyze_run`), against the run's device figures or `device`.
"""

from __future__ import annotations

from typing import Any

from bokeh.layouts import column
from bokeh.models import DataTable, Div, LayoutDOM, Range1d, TabPanel, Tabs

from workbench.analysis.breakdown import phase_window
from workbench.analysis.critical_path import CriticalPath, typical_path
from workbench.analysis.findings.bottlenecks import analyze_run
from workbench.analysis.noise import latency_noise
from workbench.analysis.roofline import run_device_spec
from workbench.analysis.summary import model_label
from workbench.analysis.timeline import count_spans, time_extent
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle
from workbench.views.counter_tracks import counter_tracks
from workbench.views.critical_path import critical_path_panel
from workbench.views.findings import findings_panel
from workbench.views.flame import call_tree_panel
from workbench.views.memory import memory_map
from workbench.views.roofline import ROOFLINE_SOURCE, link_roofline, roofline_view
from workbench.views.tables import link_table_to_timeline, op_table_view
from workbench.views.timeline import SPANS_SOURCE
from workbench.views.timeline_panes import timeline_panel

DASHBOARD_BYTES_PER_EVENT = 700
"""Peak memory the dashboard of a run takes per event of its trace, above the interpreter's own: measured by
`benchmarks/limits.py` (a 200k-event trace peaked 150-170 MB above a 2k-event one: ~760 B per event) and
rounded down, so that a run that fits is never refused."""


def dashboard_bytes(bundle: Bundle) -> int:
    """About how much memory drawing `bundle`'s dashboard takes, from its event count alone (nothing read but
    the Parquet footer): what a server checks before it starts."""
    return bundle.event_count * DASHBOARD_BYTES_PER_EVENT


def dashboard(bundle: Bundle, *, width: int = 1200, max_spans: int = 20_000, device: str | None = None,
              windows: list[tuple[int, int, str]] | None = None) -> LayoutDOM:
    """The linked views of one run (a note in place of the views when the run has no trace); the roofline
    is drawn against `device` (a built-in name, "cpu" or an accelerator YAML) when given, else against
    the device the run recorded or its trace names. `windows` (start, end, label) are the windows whose
    real spans the timeline embeds (a report's plan, `workbench.report_spans`); by default one it picks."""
    record = bundle.record
    title = " · ".join(str(part) for part in (bundle.run_id, model_label(record.model_name, record.model_weights),
                                              record.variant_name, record.device)
                       if part)
    if record.p50_ms is not None:
        noise = latency_noise(record.benchmark)
        title += f" · p50 {record.p50_ms:.3g} ms" + (f" (noisy: {noise.reason})" if noise and noise.noisy else "")
    if record.model_training:
        title += f" · {record.model_training}"
    heading = Div(text=title, render_as_text=True, styles={"font-weight": "bold", "font-size": "14px"})
    if not bundle.has_trace:
        reason = record.error or "it was captured without a profiler (--no-profile)"
        return column(heading, Div(text=f"No trace in this run: {reason}", render_as_text=True, width=width))
    trace = bundle.trace()
    events = trace.events
    first, last = time_extent(events["start_ns"].to_numpy(), events["dur_ns"].to_numpy())  # no lone marker stretches it
    last = max(last, first + 1)
    pad = max((last - first) * 0.01, 1)
    window = phase_window(trace, PHASE_MEASURE)
    # A capture opens on its steady state (the measured steps); reset and zooming out reach the rest.
    start, end = (window[0], window[1]) if window else (first, last)
    margin = max((end - start) * 0.02, 1)
    shown = (int(start - margin), int(end + margin))
    x_range = Range1d(*shown, bounds=(first - pad, last + pad))
    tracks = counter_tracks(trace, x_range=x_range, width=width)  # None when the trace has none
    time_view = timeline_panel(trace, x_range=x_range, width=width, max_spans=max_spans, windows=windows,
                               detail=shown if window and _fits(trace, shown, max_spans) else None, below=tracks)
    ops = op_table_view(trace, ("op",), window, width=width, height=320)
    kernels = op_table_view(trace, ("kernel",), window, width=width, height=320)
    spans = time_view.select_one({"name": SPANS_SOURCE})  # None when the timeline is a note
    table_sources = [table.source for table in (view.select_one({"type": DataTable}) for view in (ops, kernels))
                     if table is not None]  # a table view without rows is a note
    if spans is not None:
        for source in table_sources:
            link_table_to_timeline(source, spans)
    path = typical_path(trace)  # once: the findings' ranking and the tab both draw on it
    analysis = analyze_run(bundle, device, path=path)
    roof = _roofline_panel(bundle, analysis, device, width)
    points = roof.select_one({"name": ROOFLINE_SOURCE})
    if points is not None:
        link_roofline(points, spans, *table_sources)
    scope = f"the {PHASE_MEASURE} phase" if analysis["window"] else "the whole trace"
    tabs = Tabs(tabs=[TabPanel(child=ops, title="ops"), TabPanel(child=kernels, title="kernels"),
                      TabPanel(child=call_tree_panel(trace, window, scope=scope, x_range=x_range, timeline=time_view,
                                                     width=width), title="call tree"),
                      TabPanel(child=memory_map(trace, x_range=x_range, width=width), title="memory"),
                      TabPanel(child=roof, title="roofline"),
                      TabPanel(child=findings_panel(analysis["findings"], analysis["idle"], scope=scope, width=width,
                                                    x_range=x_range), title="findings"),
                      TabPanel(child=_critical_path_panel(path, x_range, width), title="critical path")])
    return column(heading, time_view, tabs)


def _critical_path_panel(path: CriticalPath | str, x_range: Range1d, width: int) -> LayoutDOM:
    """The critical path of the trace's typical step (`typical_path`), or a note saying why there is none."""
    if isinstance(path, str):
        return Div(text=f"No critical path: {path}", render_as_text=True, width=width)
    return critical_path_panel(path, width=width, x_range=x_range)


def _roofline_panel(bundle: Bundle, analysis: dict[str, Any], device: str | None, width: int) -> LayoutDOM:
    """The roofline of `analyze_run`'s table, or a note saying how to name a device when none is known."""
    spec = run_device_spec(bundle.record, bundle.trace(), device)
    if spec is None:
        return Div(render_as_text=True, width=width, text=(
            "No roofline: this run records no device figures and its trace names no GPU the hardware table "
            f"knows. Name the device: `workbench analyze {bundle.run_id} --device NAME` (a built-in name such as "
            "h100 or a100, cpu for this machine, or an accelerator YAML), or in a notebook "
            "wb.roofline(run, device=NAME)."))
    return roofline_view(analysis["roofline"], spec, width=width)


def _fits(trace, window: tuple[int, int], max_spans: int) -> bool:
    """Whether the real spans of `window` can all be embedded."""
    return count_spans(trace, window) <= max_spans
