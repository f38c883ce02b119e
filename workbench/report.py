"""Self-contained HTML reports: one file with inline BokehJS that opens from disk with no network."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bokeh.embed import file_html
from bokeh.models import LayoutDOM, TabPanel, Tabs
from bokeh.resources import INLINE

from workbench.trace.store.bundle import Bundle
from workbench.trace.store.mirror_bundle import write_atomic
from workbench.trace.store.records import display_name


def report_layout(bundles: Sequence[Bundle], *, baseline: str | int | None = None) -> LayoutDOM:
    """One run: its dashboard. Several: the comparison first, then each run's dashboard in a tab. Before them,
    in tabs of their own, the views their kind adds (`views.run_kinds`: generation runs, ranks of a job); the ranks
    of a large job, or of one on a URL root, get their ranks view alone; serving runs a "serving" tab (the request
    waterfall of each, and a sweep's curves).
    Each timeline embeds what `workbench.report_spans` plans: every span of a trace that fits the budget,
    else the busiest steps, listed to jump to."""
    from workbench.report_spans import report_dashboard
    from workbench.views.experiments import experiments_view
    from workbench.views.run_kinds import runs_layout

    def views() -> LayoutDOM:
        if len(bundles) == 1:
            return report_dashboard(bundles[0])
        panels = [TabPanel(child=experiments_view(bundles, baseline=baseline), title="compare")]
        panels += [TabPanel(child=report_dashboard(b), title=display_name(b.record)) for b in bundles]
        return Tabs(tabs=panels)

    return runs_layout(views, bundles, "runs")


EMBED_BYTES = 8 << 20
"""Largest Perfetto trace embedded in a report (base64: a third larger), so its button works from disk; a larger
one is fetched from beside the report, which needs the report served over HTTP (its link downloads it anyway)."""


def write_run_report(bundles: Sequence[Bundle], path: str | os.PathLike[str], title: str, *,
                     baseline: str | int | None = None) -> Path:
    """`report_layout` of `bundles` written to `path`, after each run's Perfetto trace (with its typical step's
    critical path as a track of its own), written beside it as `<report name>.<run id>.perfetto-trace`
    (`workbench.export`), under "Open in Perfetto" links and buttons. Runs
    of a URL traces root are left out: their tables stay where they lie (`trace.store.mirror`) rather than come down
    for a trace file."""
    from bokeh.layouts import column

    from workbench.export import export_run
    from workbench.trace.store.mirror_bundle import remote_bundle
    from workbench.views.perfetto_link import PerfettoTrace, perfetto_links

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    traces = []
    for bundle in bundles:
        if not bundle.has_trace or remote_bundle(bundle.path) is not None:
            continue
        out = path.with_name(f"{path.stem}.{bundle.run_id}.perfetto-trace")
        summary = export_run(bundle.path, "perfetto", out, critical_path=True)
        embedded = out.read_bytes() if summary["bytes"] <= EMBED_BYTES else None
        traces.append(PerfettoTrace(display_name(bundle.record), out.name, embedded))
    layout = report_layout(bundles, baseline=baseline)
    return write_report(column(perfetto_links(traces), layout) if traces else layout, path, title)


def write_report(layout: LayoutDOM, path: str | os.PathLike[str], title: str) -> Path:
    """Write `layout` as one HTML file (BokehJS inline), atomically: a temp file renamed into place, readable as a
    plain write would leave it (a report is for sharing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, file_html(layout, INLINE, title))
    return path
