"""The analysis views (roofline, findings, diff), their place in the dashboard, and the notebook's analysis
functions, built on a real CPU capture and the shared GPU fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import bokeh.io
import numpy as np
import pandas as pd
import pytest
from bokeh.embed import file_html
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    DataTable,
    Div,
    GlyphRenderer,
    HoverTool,
    HTMLTemplateFormatter,
    LogScale,
    Scatter,
    StringFormatter,
    Tabs,
)
from bokeh.plotting import figure
from bokeh.resources import INLINE
from click.testing import CliRunner
from conftest import PAYLOADS, TINY_CAPTURE, fixture_path, payload_trace

import workbench as wb
from workbench.analysis.breakdown import phase_window
from workbench.analysis.diff import DIFF_COLUMNS, trace_diff
from workbench.analysis.findings.bottlenecks import FINDING_COLUMNS, analyze_run, find_bottlenecks, findings_table
from workbench.analysis.findings.finding import Finding
from workbench.analysis.fusion import TABLE_COLUMNS
from workbench.analysis.idle import GAP_COLUMNS, idle_summary
from workbench.analysis.roofline import ROOFLINE_COLUMNS, roofline, run_device_spec
from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.hardware import resolve_device_spec
from workbench.trace import Trace, read_trace
from workbench.trace.store.bundle import Bundle, open_bundle
from workbench.views._table import hover_formatter
from workbench.views.dashboard import dashboard
from workbench.views.diff import DELTA_BARS, DIFF_TABLE, STATUS_COLORS, diff_view
from workbench.views.findings import EVIDENCE, FINDINGS_TABLE, findings_panel
from workbench.views.roofline import MAX_POINT_PX, MIN_POINT_PX, ROOFLINE_SOURCE, roofline_view
from workbench.views.tables import OP_TABLE_NAME
from workbench.views.timeline import SPANS_SOURCE


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> tuple[Path, list[Bundle]]:
    """A tiny CPU experiment (eager and bf16), captured through the CLI."""
    root = tmp_path_factory.mktemp("traces")
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root),
                                       "--json"])
    assert result.exit_code == 0, result.output
    return root, [open_bundle(run["run_id"], root) for run in json.loads(result.stdout)["runs"]]


@pytest.fixture(scope="module")
def resnet() -> Trace:
    return read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, Bundle, Bundle]:
    """The ResNet-50 GPU fixture and the payload trace, imported as runs."""
    root = tmp_path_factory.mktemp("imports")
    evil = payload_trace(tmp_path_factory.mktemp("evil") / "evil.json")
    bundles = []
    for path in (fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"), evil):
        result = CliRunner().invoke(main, ["import", str(path), "--out", str(root), "--json"])
        assert result.exit_code == 0, result.output
        (run_id,) = json.loads(result.stdout)
        bundles.append(open_bundle(run_id, root))
    return root, bundles[0], bundles[1]


@pytest.fixture(scope="module")
def diff_pair() -> tuple[Trace, Trace]:
    return tuple(read_trace(fixture_path("kineto", f"diff_{side}.json.gz")) for side in ("control", "test"))


def _placeable(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a log–log roofline can show: intensity and achieved FLOP/s known and positive."""
    keep = (table["intensity"] > 0) & (table["achieved_flops_per_s"] > 0)
    keep &= np.isfinite(table["intensity"]) & np.isfinite(table["achieved_flops_per_s"])
    return table[keep.fillna(False)].reset_index(drop=True)


def _renderers_of(layout, source: ColumnDataSource) -> list[GlyphRenderer]:
    return [r for r in layout.select({"type": GlyphRenderer}) if r.data_source is source]


def _link_targets(source: ColumnDataSource) -> list[CustomJS]:
    return [cb for cb in source.selected.js_property_callbacks.get("change:indices", []) if isinstance(cb, CustomJS)]


# -- roofline ------------------------------------------------------------------------------------------


def test_roofline_view_places_each_row_with_known_work(resnet):
    spec = resolve_device_spec("a100")
    table = roofline(resnet, spec, kinds=("op", "kernel"))
    expected = _placeable(table)
    assert 0 < len(expected) < len(table)  # rows of unknown work (most cuDNN kernels) cannot be placed
    view = roofline_view(table, spec)
    points = view.select_one({"name": ROOFLINE_SOURCE})
    assert points.data["name"].tolist() == expected["name"].tolist()
    assert points.data["bound"].tolist() == expected["bound"].tolist()
    np.testing.assert_allclose(points.data["intensity"], expected["intensity"])
    np.testing.assert_allclose(points.data["achieved_flops_per_s"], expected["achieved_flops_per_s"])
    (dots,) = _renderers_of(view, points)
    assert isinstance(dots.glyph, Scatter)
    fig = next(f for f in view.select({"type": figure}))
    assert isinstance(fig.x_scale, LogScale) and isinstance(fig.y_scale, LogScale)
    # area ∝ time: size² / time is one constant above the smallest drawn size
    size, time_ms = points.data["size"], points.data["time_ms"]
    assert size.max() == pytest.approx(MAX_POINT_PX) and size.min() >= MIN_POINT_PX
    scaled = size > MIN_POINT_PX
    ratio = size[scaled] ** 2 / time_ms[scaled]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)
    hover = next(h for h in fig.select({"type": HoverTool}) if dots in h.renderers)
    assert ("name", "@name") in hover.tooltips
    assert len(fig.legend[0].items) == len(set(expected["bound"]))


def test_roofline_has_a_ceiling_per_dtype_and_the_bandwidth_slope(resnet):
    spec = resolve_device_spec("a100")
    fig = next(roofline_view(roofline(resnet, spec, kinds=("op", "kernel")), spec).select({"type": figure}))
    bandwidth = spec.memory_bw_bytes_per_s
    for dtype, peak in spec.peak_flops.items():
        (line,) = fig.select({"name": f"ceiling {dtype}"})
        assert list(line.data_source.data["y"]) == [peak, peak]
        assert line.data_source.data["x"][0] == pytest.approx(peak / bandwidth)  # from its ridge point on
    (slope,) = fig.select({"name": "bandwidth"})
    x, y = slope.data_source.data["x"], slope.data_source.data["y"]
    assert y[0] / x[0] == pytest.approx(bandwidth) and y[1] / x[1] == pytest.approx(bandwidth)
    assert y[1] == max(spec.peak_flops.values())


def test_roofline_without_known_work_is_a_note(resnet):
    spec = resolve_device_spec("a100")
    table = roofline(resnet, spec, kinds=("op", "kernel"))
    view = roofline_view(table[table["intensity"].isna()], spec)
    assert isinstance(view, Div) and view.render_as_text and "None of the" in view.text


# -- findings ------------------------------------------------------------------------------------------


def test_findings_panel_ranks_findings_and_shows_evidence_and_idle(resnet):
    spec = resolve_device_spec("a100")
    findings = find_bottlenecks(resnet, roofline(resnet, spec, kinds=("op", "kernel")))
    frame = findings_table(findings)
    idle = idle_summary(resnet)
    panel = findings_panel(frame, idle)
    table = panel.select_one({"name": FINDINGS_TABLE})
    data = table.source.data
    assert data["kind"].tolist() == frame["kind"].tolist()
    np.testing.assert_allclose(data["time_share"], frame["time_share"])
    assert list(data["time_share"]) == sorted(data["time_share"], reverse=True)
    assert {c.field for c in table.columns} == {"rank", "kind", "device", "time_share", "title", "suggestion"}
    evidence = panel.select_one({"name": EVIDENCE})
    assert evidence.render_as_text
    first = findings[0]
    assert evidence.text.startswith(f"{first.kind}: {first.title}")
    assert json.loads(evidence.text.split("evidence: ", 1)[1]) == first.to_dict()["evidence"]
    (show,) = _link_targets(table.source)
    assert show.args["div"] is evidence
    idle_table = next(t for t in panel.select({"type": DataTable}) if "idle_ms" in t.source.data)
    assert idle_table.source.data["device"].tolist() == list(idle)
    np.testing.assert_allclose(idle_table.source.data["idle_ms"], [s["idle_ns"] / 1e6 for s in idle.values()])


def test_findings_panel_without_findings_or_devices_says_so():
    text = " ".join(m.text for m in findings_panel([], {}).select({"type": Div}))
    assert "No findings" in text and "no device work" in text


# -- diff ----------------------------------------------------------------------------------------------


def test_diff_view_table_deltas_and_aligned_timelines(diff_pair):
    a, b = diff_pair
    assert phase_window(a) is None and phase_window(b) is None  # imported traces: the whole trace counts
    expected = trace_diff(a, b)
    layout = diff_view(a, b, ("control", "test"), top=15)
    table = layout.select_one({"name": DIFF_TABLE})
    data = table.source.data
    assert data["name"].tolist() == expected["name"].tolist()
    assert data["status"].tolist() == expected["status"].tolist()
    assert list(data["status_color"]) == [STATUS_COLORS[s] for s in expected["status"]]
    assert {"new", "vanished", "changed"} <= set(expected["status"])
    status = next(c for c in table.columns if c.field == "status")
    assert status.formatter.background_color.field == "status_color"
    bars = layout.select_one({"name": DELTA_BARS})
    top = expected[expected["delta_ns"] != 0].head(15)
    assert bars.data["name"].tolist() == top["name"].tolist()
    np.testing.assert_allclose(bars.data["delta_ms"], top["delta_ns"] / 1e6)
    assert len(_renderers_of(layout, bars)) == 1  # one bar glyph for the rows
    timelines = [f for f in layout.select({"type": figure}) if str(f.title.text).startswith("Timeline")]
    assert len(timelines) == 2 and timelines[0].x_range is timelines[1].x_range
    spans = list(layout.select({"name": SPANS_SOURCE}))
    assert len(spans) == 2
    (link,) = _link_targets(table.source)
    assert all(s in link.args["span_sources"] for s in spans)
    (bar_link,) = _link_targets(bars)
    assert table.source in bar_link.args["span_sources"]
    heading = layout.children[0]
    assert heading.render_as_text and "control" in heading.text
    assert f"{(expected['status'] == 'vanished').sum()} vanished" in heading.text


def test_diff_view_needs_two_labels(diff_pair):
    with pytest.raises(WorkbenchError, match="different labels"):
        diff_view(*diff_pair, ("same", "same"))


# -- dashboard -----------------------------------------------------------------------------------------


def test_dashboard_gains_linked_roofline_and_findings_tabs(captured):
    _, bundles = captured
    bundle = bundles[0]
    layout = dashboard(bundle)
    tabs = layout.select_one({"type": Tabs})
    assert [p.title for p in tabs.tabs] == ["ops", "kernels", "call tree", "memory", "roofline", "findings",
                                                "critical path"]
    result = analyze_run(bundle)
    assert result["device"] == "cpu"  # the capture recorded its measured CPU figures
    points = layout.select_one({"name": ROOFLINE_SOURCE})
    expected = _placeable(pd.DataFrame(result["roofline"], columns=list(ROOFLINE_COLUMNS)))
    assert points.data["name"].tolist() == expected["name"].tolist()
    spans = layout.select_one({"name": SPANS_SOURCE})
    op_table = layout.select_one({"name": OP_TABLE_NAME}).source
    (link,) = _link_targets(points)
    assert link.args["spans"] is spans and op_table in link.args["tables"]
    findings = layout.select_one({"name": FINDINGS_TABLE})
    assert findings.source.data["kind"].tolist() == [f["kind"] for f in result["findings"]]


def test_dashboard_roofline_says_how_to_name_a_device(imported):
    _, _, evil = imported
    layout = dashboard(evil)
    roof = next(p for p in layout.select_one({"type": Tabs}).tabs if p.title == "roofline").child
    assert isinstance(roof, Div) and f"workbench analyze {evil.run_id} --device NAME" in roof.text


def test_dashboard_roofline_against_a_named_device(imported):
    _, resnet_run, _ = imported
    layout = dashboard(resnet_run, device="a100")
    title = next(f for f in layout.select({"type": figure}) if str(f.title.text).startswith("Roofline")).title.text
    assert "a100" in title
    assert len(layout.select_one({"name": ROOFLINE_SOURCE}).data["name"]) > 0


# -- escaping ------------------------------------------------------------------------------------------


def _assert_names_are_text(layout) -> None:
    """No payload reaches the page as markup: hover templates hold no names, markup holding one renders
    as text, tables use text formatters, and the written HTML has no payload verbatim."""
    for model in layout.references():
        if isinstance(model, HoverTool):
            assert not any(p in str(model.tooltips) for p in PAYLOADS)
        if isinstance(model, Div) and any(p in model.text for p in PAYLOADS):
            assert model.render_as_text
        if isinstance(model, DataTable):
            for c in model.columns:
                if isinstance(c.formatter, HTMLTemplateFormatter):  # a name whole on hover: escaped copies only
                    assert c.formatter.template == hover_formatter(c.field).template
                    assert not any(p in text for p in PAYLOADS for text in model.source.data[c.field + "_escaped"])
                else:
                    assert c.field != "name" or isinstance(c.formatter, StringFormatter)
    html = file_html(layout, INLINE, "payloads")
    for payload in PAYLOADS:
        assert payload not in html


def test_payload_names_stay_text(imported, resnet, captured):
    _, _, evil = imported
    _assert_names_are_text(dashboard(evil, device="a100"))
    spec = resolve_device_spec("a100")
    rows = _placeable(roofline(resnet, spec, kinds=("op", "kernel"))).head(2).copy()
    rows["name"] = list(PAYLOADS)
    view = roofline_view(rows, spec)
    assert view.select_one({"name": ROOFLINE_SOURCE}).data["name"].tolist() == list(PAYLOADS)
    _assert_names_are_text(view)
    finding = Finding(kind="launch_bound", time_share=0.5, device="cuda:0", title=f"{PAYLOADS[0]} is slow",
                      suggestion="fuse it", evidence={"top_short_kernels": [{"name": PAYLOADS[1], "ns": 5}]})
    panel = findings_panel(findings_table([finding]), {})
    assert PAYLOADS[1] in panel.select_one({"name": EVIDENCE}).text
    _assert_names_are_text(panel)
    _, bundles = captured
    diff = diff_view(evil.trace(), bundles[0].trace(), (PAYLOADS[0], "tiny"))
    assert set(PAYLOADS) <= set(diff.select_one({"name": DIFF_TABLE}).source.data["name"])
    _assert_names_are_text(diff)


# -- notebook functions --------------------------------------------------------------------------------


def test_notebook_analyses_return_documented_frames(captured):
    root, bundles = captured
    eager, bf16 = bundles
    roof = wb.roofline(eager.run_id, root=root)
    assert list(roof.columns) == list(ROOFLINE_COLUMNS) and len(roof) > 0
    assert roof["intensity"].dtype == np.float64 and np.issubdtype(roof["time_ns"].dtype, np.number)
    direct = roofline(eager.trace(), run_device_spec(eager.info, eager.trace()), kinds=("op", "kernel"))
    assert roof["name"].tolist() == direct["name"].tolist()
    np.testing.assert_allclose(roof["time_ns"], direct["time_ns"])
    found = wb.findings(eager)
    assert list(found.columns) == list(FINDING_COLUMNS)
    assert found["kind"].tolist() == [f["kind"] for f in analyze_run(eager)["findings"]]
    gaps = wb.idle([eager])
    assert list(gaps.columns) == list(GAP_COLUMNS) and gaps.empty  # a CPU run has no device
    delta = wb.diff(eager, bf16.path)
    assert list(delta.columns) == list(DIFF_COLUMNS)
    windows = [phase_window(b.trace()) for b in bundles]
    expected = trace_diff(eager.trace(), bf16.trace(), window_a=windows[0], window_b=windows[1])
    pd.testing.assert_frame_equal(delta, expected)
    assert wb.diff(eager.trace(), bf16.trace(), phase=None).equals(trace_diff(eager.trace(), bf16.trace()))
    fused = wb.fusion(bundles)
    assert list(fused.columns) == list(TABLE_COLUMNS) and fused["variant"].tolist() == ["eager", "bf16"]


def test_notebook_analyses_of_imported_gpu_runs(imported):
    root, resnet_run, evil = imported
    gaps = wb.idle(resnet_run.path)
    assert list(gaps.columns) == list(GAP_COLUMNS) and set(gaps["device"]) == {"cuda:0"}
    assert gaps["dur_ns"].is_monotonic_decreasing
    with pytest.raises(WorkbenchError, match="no device figures"):
        wb.roofline(evil)
    roof = wb.roofline(resnet_run.run_id, device="a100", root=root)
    assert (roof["peak_dtype"] == "fp32").any() and set(roof["kind"]) == {"op", "kernel"}


def test_notebook_one_run_functions_refuse_several(captured):
    _, bundles = captured
    with pytest.raises(WorkbenchError, match="takes one run, got 2"):
        wb.findings(bundles)


def test_show_diff_renders_the_diff_view(captured, monkeypatch):
    _, bundles = captured
    shown = []
    monkeypatch.setattr(bokeh.io, "show", shown.append)
    monkeypatch.setattr(bokeh.io, "output_notebook", lambda *args, **kwargs: None)
    wb.show_diff(bundles[0], bundles[1])
    (layout,) = shown
    assert layout.select_one({"name": DIFF_TABLE}) is not None
    assert "A = eager, B = bf16" in layout.children[0].text


# -- the links, run in a browser -----------------------------------------------------------------------

SELECT_POINTS = """async () => {
  const doc = Bokeh.documents[0]
  const points = doc.get_model_by_name('roofline points')
  const spans = doc.get_model_by_name('timeline spans')
  const picked = ['op', 'kernel'].map((kind) => points.data.kind.indexOf(kind))
  points.selected.indices = picked
  await new Promise((done) => setTimeout(done, 500))  // BokehJS runs callbacks as promises
  const tables = [...doc.all_models].filter((m) => m.data !== undefined && m.data.step_share !== undefined)
  return {
    picked: picked.map((i) => points.data.name[i]),
    spans: [...new Set(spans.selected.indices.map((i) => spans.data.name[i]))],
    tables: tables.map((t) => t.selected.indices.map((i) => t.data.name[i])),
  }
}"""


def test_selected_points_select_their_names_in_tables_and_timeline(imported, tmp_path):
    """An op and a kernel point: each table selects its name and the timeline ends up with both (the
    tables' own links fire after the points' link and must not leave only their own names)."""
    import shutil

    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    _, resnet_run, _ = imported
    html = tmp_path / "dashboard.html"
    html.write_text(file_html(dashboard(resnet_run, device="a100"), INLINE, "dashboard"))
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html.as_uri())
        page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=20_000)
        seen = page.evaluate(SELECT_POINTS)
        browser.close()
    assert errors == []
    op, kernel = seen["picked"]
    assert sorted(map(tuple, seen["tables"])) == sorted([(op,), (kernel,)])
    assert {op, kernel} <= set(seen["spans"])
