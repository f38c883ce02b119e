"""Self-contained HTML reports: one file with inline BokehJS that opens from disk with no network."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bokeh.embed import file_html
from bokeh.models import LayoutDOM, TabPanel, Tabs
from bokeh.resources import INLINE

from workbench.trace.store.bundle import Bundle
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


def write_report(layout: LayoutDOM, path: str | os.PathLike[str], title: str) -> Path:
    """Write `layout` as one HTML file (BokehJS inline), atomically: a temp file renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    html = file_html(layout, INLINE, title)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                     suffix=".tmp", delete=False) as tmp:
        try:
            tmp.write(html)
        except BaseException:
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, path)
    return path
