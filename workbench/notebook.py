"""The notebook front door: `wb.capture`, `wb.show`, `wb.compare` (the CLI's functions, placed inline).

BokehJS is loaded inline (`output_notebook(INLINE)`), so notebooks render and export offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.paths import traces_root
from workbench.trace.bundle import Bundle

RunRef = str | Path | Bundle


def capture(root: str | Path | None = None, **settings: Any) -> list[Bundle]:
    """Run an experiment (see `workbench.experiment.ExperimentSettings` for the settings) and return its
    runs' bundles, the reference first."""
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.trace.bundle import open_bundle

    result = run_experiment(ExperimentSettings(**settings), root)
    return [open_bundle(run.path, traces_root(root)) for run in result.runs]


def show(runs: RunRef | Sequence[RunRef], root: str | Path | None = None) -> None:
    """Render one run's dashboard, or the comparison and dashboards of several runs or an experiment."""
    from bokeh.io import output_notebook
    from bokeh.io import show as bokeh_show
    from bokeh.resources import INLINE

    from workbench.report import report_layout

    output_notebook(INLINE, hide_banner=True)
    bokeh_show(report_layout(_bundles(runs, root)))


def compare(runs: Sequence[RunRef], root: str | Path | None = None) -> None:
    """Render the comparison view of several runs (latency, speedup, numerics, ops aligned)."""
    from bokeh.io import output_notebook
    from bokeh.io import show as bokeh_show
    from bokeh.resources import INLINE

    from workbench.views.compare import compare as compare_view

    output_notebook(INLINE, hide_banner=True)
    bokeh_show(compare_view(_bundles(runs, root)))


def _bundles(runs: RunRef | Sequence[RunRef], root: str | Path | None) -> list[Bundle]:
    """Bundles from bundles, run ids, bundle paths or experiment ids."""
    from workbench.report import resolve_runs

    items = [runs] if isinstance(runs, (str, Path, Bundle)) else list(runs)
    bundles: list[Bundle] = []
    for item in items:
        bundles.extend([item] if isinstance(item, Bundle) else resolve_runs([item], traces_root(root)))
    return bundles
