"""Accelerator co-design from the panel in a real `jupyter lab`, driven with headless Chromium: the sidebar's
Co-design section refuses a description file outside the traces folder with the server's message, then projects
tiny-gpt onto a device of the hardware table with a bandwidth sweep as a job whose tab shows its progress and then the
report, whose operator bars, kind totals and sweep curve carry the figures `workbench project ... --json` prints; a
run's dashboard toolbar opens the section with that run, whose projection over its measured steps draws one bar per
operator of the CLI's. Screenshot: docs/images/panel-project.png."""
# ruff: noqa: F811  (the Lab fixtures, imported from test_lab_browser, are the tests' arguments)

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_path
from test_lab_browser import (  # noqa: F401 (browser, lab, page: the fixtures of Chromium, a Lab and its page)
    CAPTURE_TIMEOUT_MS,
    browser,
    canvases,
    lab,
    layout_width,
    page,
    pytestmark,
    run_row,
    shot,
    view_selector,
    wait_for_plots,
)

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
DEVICE = "h100-sxm"
SWEEP = "0.5,1,2,4"
BARS_TITLE = "projected time per operator (program order), by bound"
KINDS_TITLE = "projected time per step by operator kind"
CURVE_TITLE = "step time against bandwidth, relative to the description as written"
UNITS = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9}
TAB = '[id^="workbench-project-"]'
FIGURE = """(title) => {
  const figures = Bokeh.documents.flatMap((d) => [...d.all_models])
    .filter((m) => m.type == 'Figure' && (m.title?.text ?? '') == title);
  const f = figures[figures.length - 1];
  const columns = (d) => Object.fromEntries((d instanceof Map ? [...d.entries()] : Object.entries(d))
    .map(([k, v]) => [k, Array.from(v)]));
  return {left: f.left[0].axis_label, below: f.below[0].axis_label,
          sources: f.renderers.filter((r) => r.data_source != null).map((r) => columns(r.data_source.data))};
}"""
"""The axis labels and the renderers' data of the last figure titled `title` in the page's Bokeh documents."""


def cli_project(lab, *args: str) -> dict[str, Any]:
    """`workbench project ... --json` on the Lab's traces folder, as a user would run it in a terminal."""
    done = subprocess.run([sys.executable, "-m", "workbench", "project", *args, "--out", str(lab.traces), "--json"],
                          cwd=lab.root_dir, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def run(lab) -> str:
    """A small ROCm training trace imported into the Lab's traces folder (its ops recorded their shapes)."""
    from workbench.imports import import_traces

    (run_id,) = import_traces([fixture_path("kineto", "amd_mi250_train.json.gz")], lab.traces)
    return run_id


def unit(label: str) -> float:
    """The scale (ns) of an axis labelled "time (µs)" or "time per step (µs)"."""
    return UNITS[label.rsplit("(", 1)[1].rstrip(")")]


def drawn_bars(page) -> list[tuple[str, float]]:
    """The operator bars drawn, in program order: (name, projected ns)."""
    figure = page.evaluate(FIGURE, BARS_TITLE)
    scale = unit(figure["left"])
    bars = {int(x): (name, top * scale) for source in figure["sources"]
            for x, top, name in zip(source["x"], source["top"], source["name"], strict=True)}
    return [bars[x] for x in sorted(bars)]


def open_section(page):
    sidebar = page.locator("#jp-workbench-sidebar")
    summary = sidebar.locator(".jp-Workbench-projectSection > summary")
    if sidebar.locator(".jp-Workbench-projectSection").get_attribute("open") is None:
        summary.click()
    return sidebar.get_by_role("region", name="Co-design")


def test_a_projection_from_the_sidebar_draws_the_clis_figures(lab, page):
    cli = cli_project(lab, "tiny-gpt", "--accelerator", DEVICE, "--sweep", f"bandwidth={SWEEP}")
    widths: list[int] = []
    page.on("request", lambda r: widths.append(layout_width(r.url))
            if "/workbench/api/project/" in r.url and "/view?width=" in r.url else None)
    section = open_section(page)
    project = section.get_by_role("button", name="Project", exact=True)
    device = section.locator("#jp-Workbench-project-device")
    device.locator(f'option[value="{DEVICE}"]').wait_for(state="attached", timeout=30_000)  # the server's devices

    # a description file outside the traces folder: the server's message, in place, and no job
    (lab.root_dir / "outside.yaml").write_text("name: outside\n")
    device.select_option("")
    section.locator("#jp-Workbench-project-file").fill("../outside.yaml")
    project.click()
    error = section.locator(".jp-Workbench-error")
    error.wait_for(timeout=30_000)
    assert "accelerator: '../outside.yaml' leads outside the traces root; refused" in error.text_content()
    assert str(lab.root_dir) not in error.text_content()
    assert page.locator(TAB).count() == 0

    device.select_option(DEVICE)
    assert section.locator("#jp-Workbench-project-knob-0").input_value() == "bandwidth"
    assert section.locator("#jp-Workbench-project-values-0").input_value() == SWEEP
    project.click()
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=f"Projection: tiny-gpt on {DEVICE}")
    tab.wait_for(timeout=30_000)
    assert error.count() == 0  # the last attempt's error went away
    outcome = page.locator(f"{TAB} .jp-Workbench-projectOutcome")
    page.locator(f"{TAB} [role=progressbar]").or_(outcome).first.wait_for(timeout=30_000)
    outcome.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "jp-mod-succeeded" in (outcome.get_attribute("class") or ""), outcome.text_content()
    findings = len(cli["guidance"])
    assert outcome.text_content() == (f"Projected {cli['title']} onto {DEVICE}: {len(cli['ops'])} operators, "
                                      f"{findings} guidance finding{'' if findings == 1 else 's'}.")

    wait_for_plots(page, TAB)
    bars = drawn_bars(page)
    assert [name for name, _ in bars] == [op["name"] for op in cli["ops"]]
    assert [ns for _, ns in bars] == pytest.approx([op["time_ns"] for op in cli["ops"]], rel=1e-9)
    assert sum(ns for _, ns in bars) == pytest.approx(cli["step_ns"], rel=1e-9)  # one step: the bars are the total

    kinds = page.evaluate(FIGURE, KINDS_TITLE)
    stack = kinds["sources"][0]  # one source, a renderer per bound
    categories = [key for key in stack if key not in ("kind", "total")]
    scale = unit(kinds["below"])
    totals = {kind: sum(stack[c][i] for c in categories) * scale for i, kind in enumerate(stack["kind"])}
    assert totals == pytest.approx({row["kind"]: row["time_ns"] for row in cli["by_kind"]}, rel=1e-9)

    curve = page.evaluate(FIGURE, CURVE_TITLE)["sources"][0]
    (swept,) = cli["sweeps"]
    assert curve["value"] == [row["value"] for row in swept] == ["0.5x", "1x", "2x", "4x"]
    assert curve["ratio"] == pytest.approx([1 / row["speedup"] for row in swept], rel=1e-9)
    assert page.locator(f"{TAB} .jp-Workbench-viewStatus").is_hidden()
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "panel-project.png"))

    # a narrower window: the tab asks for a narrower layout, drawn from the job's result
    first = widths[-1]
    with page.expect_response(lambda r: "/workbench/api/project/" in r.url, timeout=30_000) as narrower:
        page.set_viewport_size({"width": 1100, "height": 950})
    assert narrower.value.ok
    assert layout_width(narrower.value.url) <= first - 300, (first, narrower.value.url)
    page.locator(f"{TAB} .jp-Workbench-viewStatus").wait_for(state="hidden", timeout=30_000)
    assert canvases(page, TAB) > 0

    # closed, the sidebar's outcome opens it again
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    tab.wait_for(state="detached")
    section.get_by_role("button", name="Show the report").click()
    tab.wait_for(timeout=30_000)
    wait_for_plots(page, TAB)
    assert page.seen.errors == []
    assert page.seen.dialogs == []


def test_a_runs_dashboard_projects_the_run(lab, page, run):
    cli = cli_project(lab, run, "--accelerator", DEVICE, "--sweep", f"bandwidth={SWEEP}")
    run_row(page, run).locator(".jp-Workbench-runName").click()
    dashboard = page.locator(view_selector([run]))
    dashboard.get_by_role("button", name="Co-design").wait_for(timeout=30_000)
    dashboard.get_by_role("button", name="Co-design").click()
    section = page.locator("#jp-workbench-sidebar").get_by_role("region", name="Co-design")
    section.wait_for(timeout=10_000)
    assert section.locator("#jp-Workbench-project-source").input_value() == "run"
    assert section.locator("#jp-Workbench-project-run").input_value() == run
    section.locator(f'#jp-Workbench-project-device option[value="{DEVICE}"]').wait_for(state="attached")
    section.get_by_role("button", name="Project", exact=True).click()
    # the tab names the run as the runs list does (an import: its file's name)
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=f"Projection: amd_mi250_train on {DEVICE}").wait_for(
        timeout=30_000)
    outcome = page.locator(f"{TAB} .jp-Workbench-projectOutcome")
    outcome.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "jp-mod-succeeded" in (outcome.get_attribute("class") or ""), outcome.text_content()
    steps = cli["steps"]
    assert outcome.text_content().startswith(
        f"Projected run {run} onto {DEVICE}: {len(cli['ops'])} operators over {steps} steps")
    wait_for_plots(page, TAB)
    bars = drawn_bars(page)
    assert [name for name, _ in bars] == [op["name"] for op in cli["ops"]]
    assert [ns for _, ns in bars] == pytest.approx([op["time_ns"] for op in cli["ops"]], rel=1e-9)
    assert sum(ns for _, ns in bars) / steps == pytest.approx(cli["step_ns"], rel=1e-9)
    shot(page, "60-project-run")
    assert page.seen.errors == []
    assert page.seen.dialogs == []
