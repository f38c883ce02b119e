"""Comparing two imported GPU traces in a real `jupyter lab` with headless Chromium: the before/after pair of
../shared/fixtures/kineto (diff_control, diff_test) imported as a user would, both selected and compared in the
panel. Every label is the run's display name (the imported file's name, never an id or "eager"), the kernel deltas
drawn equal the figures computed straight from the raw gzip JSON, and no plot is drawn without data. The screenshot
goes to docs/images/compare-imported.png."""

# ruff: noqa: F811 (the Lab fixtures imported below are used as fixture parameters of the same names)
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fixture_path
from test_diff_compare import NAMES, raw_figures
from test_lab_browser import (  # the same Lab server, browser and panel fixtures
    Lab,  # noqa: F401
    browser,  # noqa: F401
    lab,  # noqa: F401
    page,  # noqa: F401
    pytestmark,  # noqa: F401
    run_row,
    view_selector,
    wait_for_plots,
)

from workbench.imports import import_traces

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
DOC = "Bokeh.documents.find((d) => d.roots().some((r) => r.select({type: Bokeh.Models.get('DataTable')}).length))"


@pytest.fixture(scope="module")
def imported(lab) -> list[str]:
    return import_traces([fixture_path("kineto", f"{name}.json.gz") for name in NAMES], lab.traces)


def test_compare_two_imported_traces(lab, page, imported):
    sidebar = page.locator("#jp-workbench-sidebar")
    sidebar.get_by_role("button", name="Refresh", exact=True).click()
    for run in imported:
        run_row(page, run).wait_for(timeout=30_000)
    # the runs list names them by their files, in full
    shown = [run_row(page, run).text_content() for run in imported]
    assert all(name in text for name, text in zip(NAMES, shown, strict=True))
    for run in imported:
        run_row(page, run).get_by_role("checkbox").check()
    sidebar.get_by_role("button", name="Compare", exact=True).click()
    view = view_selector(imported)
    wait_for_plots(page, view)
    page.wait_for_function(f"() => {DOC} != null", timeout=60_000)
    seen = page.evaluate(f"""() => {{
const doc = {DOC}, models = [...doc.all_models];
const texts = models.filter((m) => m.type == 'Div').map((m) => m.text);
const tables = models.filter((m) => m.type == 'DataTable').map((t) => {{
  const data = {{}};
  for (const [k, v] of (t.source.data instanceof Map ? t.source.data : new Map(Object.entries(t.source.data))))
    data[k] = [...v];
  return data;
}});
const plots = models.filter((m) => m.type == 'Figure').map((f) => ({{
  title: f.title?.text ?? '',
  rows: f.renderers.filter((r) => r.data_source != null)
    .map((r) => {{ const d = r.data_source.data; const v = d instanceof Map ? [...d.values()] : Object.values(d);
                  return v.length ? v[0].length : 0; }}),
}}));
const headers = models.filter((m) => m.type == 'TableColumn').map((c) => c.title);
return {{texts, tables, plots, headers}};
}}""")
    heading = next(t for t in seen["texts"] if "compared against" in t)
    assert heading.startswith("2 runs (diff_control, diff_test) compared against diff_control")
    everything = " ".join(seen["texts"] + seen["headers"])
    assert "eager" not in everything and not any(run in everything for run in imported)
    # no empty plot: every figure drawn has a renderer with data
    assert all(max(plot["rows"], default=0) > 0 for plot in seen["plots"]), seen["plots"]
    assert not {"latency per call (ms)", "speedup vs reference (median)"} & {p["title"] for p in seen["plots"]}
    # the step table names both runs by display name
    steps = next(t for t in seen["tables"] if "source" in t and "run" in t)
    assert steps["run"] == list(NAMES)
    # the kernel deltas drawn equal the raw files' figures
    (base_count, base_time), (test_count, test_time) = (raw_figures(fixture_path("kineto", f"{name}.json.gz"))
                                                        ["kernel"] for name in NAMES)
    kernels = next(t for t in seen["tables"] if "delta_ms" in t and "name" in t
                   and any(n in base_count or n in test_count for n in t["name"]))
    assert kernels["name"]
    for k, name in enumerate(kernels["name"]):
        assert kernels["count_a"][k] == base_count.get(name, 0) and kernels["count_b"][k] == test_count.get(name, 0)
        assert kernels["delta_ms"][k] == pytest.approx((test_time.get(name, 0) - base_time.get(name, 0)) / 1e6,
                                                       abs=1e-9)
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(500)
    page.screenshot(path=str(IMAGES / "compare-imported.png"))
    assert page.seen.errors == []
