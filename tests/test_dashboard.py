"""The run dashboard: timeline, tables and memory map combined, with their links wired."""

from __future__ import annotations

import json

from bokeh.models import ColumnDataSource, CustomJS, DataTable, Range1d
from bokeh.plotting import figure
from click.testing import CliRunner
from conftest import TINY_CAPTURE, fixture_path

from workbench.analysis.breakdown import op_table, phase_window
from workbench.cli import main
from workbench.trace.store.bundle import open_bundle
from workbench.views.dashboard import dashboard
from workbench.views.flame import FLAME_PLOT
from workbench.views.timeline import SPANS_SOURCE


def _imported(tmp_path, name):
    root = tmp_path / "t"
    (run_id,) = json.loads(CliRunner().invoke(main, ["import", str(fixture_path("kineto", name)), "--out", str(root),
                                                     "--json"]).stdout)
    return open_bundle(run_id, root)


def test_dashboard_links_tables_timeline_and_memory(tmp_path):
    bundle = _imported(tmp_path, "resnet50_v100_train.pt.trace.json.gz")
    layout = dashboard(bundle)
    spans = layout.select_one({"name": SPANS_SOURCE})
    assert isinstance(spans, ColumnDataSource)
    tables = list(layout.select({"type": DataTable}))
    op_tables = [t for t in tables if "step_share" in t.source.data]
    assert len(op_tables) == 2  # ops and kernels
    for table in op_tables:
        callbacks = table.source.selected.js_property_callbacks.get("change:indices", [])
        assert any(isinstance(cb, CustomJS) and spans in cb.args["span_sources"] for cb in callbacks)
    figures = list(layout.select({"type": figure}))
    # timeline, counter tracks and memory map zoom together (the flame graph's x is time inside its range)
    ranges = {id(f.x_range) for f in figures if isinstance(f.x_range, Range1d) and f.name != FLAME_PLOT}
    assert len(ranges) == 1
    kernel_names = set(op_table(bundle.trace(), ("kernel",))["name"])
    kernels = next(t for t in op_tables if t.source.data["name"][0] in kernel_names)
    assert len(kernels.source.data["name"]) == len(kernel_names)


def test_capture_dashboard_opens_on_the_measured_steps(tmp_path):
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager", "--out", str(root), "--json"])
    bundle = open_bundle(json.loads(result.stdout)["runs"][0]["run_id"], root)
    layout = dashboard(bundle)
    window = phase_window(bundle.trace(), "measure")
    fig = next(f for f in layout.select({"type": figure}) if str(f.title.text).startswith("Timeline"))
    assert fig.x_range.start <= window[0] < window[1] <= fig.x_range.end
    assert fig.x_range.end - fig.x_range.start < 1.1 * (window[1] - window[0])
    assert len(layout.select_one({"name": SPANS_SOURCE}).data["name"]) > 0  # real spans, not density


def test_run_without_trace_gets_a_note(tmp_path):
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager", "--no-profile",
                                       "--out", str(root), "--json"])
    bundle = open_bundle(json.loads(result.stdout)["runs"][0]["run_id"], root)
    text = json.dumps([getattr(m, "text", "") for m in dashboard(bundle).references()])
    assert "No trace in this run" in text
