"""The op replay from the panel in a real `jupyter lab`, driven with headless Chromium, on a tiny GPT captured with
shapes: from the run's dashboard toolbar, its replay tab runs `workbench replay` as a job with its status, and on
success draws the chart and the table, whose rows (op, inputs, calls, the trace's time, status, reason) are those
`workbench replay RUN --json` prints for the same run; an imported trace that recorded no shapes, opened from the runs
list, fails with the replay's own message. Screenshot: docs/images/replay-panel.png."""
# ruff: noqa: F811  (the Lab fixtures, imported from test_lab_browser, are the tests' arguments)

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import write_trace
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
TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16}
TOP = 8
VARIANTS = ("eager", "bf16")
CHART_TITLE = re.compile(r"median time per call \((ns|µs|ms)\): in the trace and replayed alone")
UNITS = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9}
FIGURE_TITLES = ("() => Bokeh.documents.flatMap((d) => [...d.all_models].filter((m) => m.type == 'Figure')"
                 ".map((m) => m.title?.text ?? ''))")
TABLE = """(root) => {
  const all = (node, selector) => [...node.querySelectorAll(selector)].concat(...[...node.querySelectorAll('*')]
    .filter(e => e.shadowRoot).map(e => all(e.shadowRoot, selector)));
  const text = (cells) => [...cells].map(c => c.textContent.trim());
  const rows = all(root, '.slick-row').sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
  const header = text(all(root, '.slick-header-column'));
  return {header, rows: rows.map(r => text(r.querySelectorAll('.slick-cell')))};
}"""
"""The header and the drawn rows (top to bottom) of the Bokeh table under an element, its shadow DOMs included."""


@pytest.fixture(scope="module")
def runs(lab, tmp_path_factory) -> dict[str, Any]:
    """In the Lab's traces folder: a tiny GPT's eager run profiled with shapes, and an imported trace whose ops
    recorded none; with `workbench replay --json` of the first, run as a user would in a terminal."""
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.imports import import_traces
    from workbench.profiling import ProfileSettings
    from workbench.trace.store.bundle import open_bundle

    settings = ExperimentSettings(model="tiny-gpt", variants=("eager",), batch=2, seq=16, warmup=1, iterations=2,
                                  threads=1, model_overrides=TINY_GPT,
                                  profile_settings=ProfileSettings(record_shapes=True, warmup_steps=1, active_steps=3))
    (run,) = run_experiment(settings, lab.traces).runs
    shapes = open_bundle(run.path, lab.traces).run_id
    folder = tmp_path_factory.mktemp("replay-bare")
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 40, "args": {}}
    (bare,) = import_traces([write_trace(folder / "bare.json", [op])], lab.traces)
    cli = subprocess.run([sys.executable, "-m", "workbench", "replay", shapes, "--top", str(TOP), "--variants",
                          ",".join(VARIANTS), "--json", "--out", str(lab.traces)],
                         capture_output=True, text=True, timeout=300, check=True)
    return {"shapes": shapes, "bare": bare, "cli": json.loads(cli.stdout)}


def replay_tab(run: str) -> str:
    return f'[id="workbench-replay-{run}"]'


def test_a_run_without_shapes_says_why_it_cannot_be_replayed(lab, page, runs):
    bare = runs["bare"]
    sidebar = page.locator("#jp-workbench-sidebar")
    replay = sidebar.get_by_role("button", name="Replay", exact=True)
    run_row(page, bare).wait_for(timeout=30_000)
    assert replay.is_disabled()  # one run selected, not none
    run_row(page, bare).get_by_role("checkbox").check()
    replay.click()
    tab = page.locator(replay_tab(bare))
    tab.wait_for(timeout=30_000)
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Op replay: bare").wait_for()
    tab.get_by_role("button", name="Replay", exact=True).click()
    outcome = tab.locator(".jp-Workbench-replayOutcome")
    outcome.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "jp-mod-failed" in (outcome.get_attribute("class") or "")
    text = outcome.locator(".jp-Workbench-outcomeText").text_content()
    assert text.startswith(f"Replay failed: run '{bare}' recorded no op inputs: capture it with shapes recorded"), text
    assert str(lab.root_dir) not in text
    assert canvases(page, replay_tab(bare)) == 0  # no view, and no blank one
    shot(page, "50-replay-no-shapes")
    assert page.seen.errors == []


def test_a_replay_from_the_dashboard_shows_the_clis_rows(lab, page, runs):
    shapes, cli = runs["shapes"], runs["cli"]
    views: list[str] = []
    page.on("request", lambda r: views.append(r.url) if "/workbench/api/replay/" in r.url else None)
    run_row(page, shapes).locator(".jp-Workbench-runName").click()
    dashboard = page.locator(view_selector([shapes]))
    dashboard.get_by_role("button", name="Replay ops").wait_for(timeout=30_000)
    shot(page, "51-replay-dashboard-toolbar")
    dashboard.get_by_role("button", name="Replay ops").click()
    tab = page.locator(replay_tab(shapes))
    tab.wait_for(timeout=30_000)
    tab.locator("#jp-Workbench-replay-top").fill("0")
    tab.get_by_role("button", name="Replay", exact=True).click()
    assert "top ops: a whole number from 1 to 100" in tab.locator(".jp-Workbench-error").text_content()

    tab.locator("#jp-Workbench-replay-top").fill(str(TOP))
    tab.locator("#jp-Workbench-replay-compile").uncheck()
    tab.get_by_role("button", name="Replay", exact=True).click()
    outcome = tab.locator(".jp-Workbench-replayOutcome")
    tab.get_by_role("progressbar").or_(outcome).first.wait_for(timeout=30_000)
    assert tab.locator(".jp-Workbench-error").count() == 0  # the last attempt's error went away
    if tab.get_by_role("progressbar").count():
        assert tab.locator(".jp-Workbench-task").text_content() == f"replaying the top {TOP} ops: eager, bf16"
    outcome.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "jp-mod-succeeded" in (outcome.get_attribute("class") or ""), outcome.text_content()
    ok = sum(row["status"] == "ok" for row in cli["rows"])
    assert outcome.locator(".jp-Workbench-outcomeText").text_content().startswith(
        f"Replayed {ok} of {len(cli['rows'])} op signatures (eager, bf16)")

    wait_for_plots(page, replay_tab(shapes))
    assert any(CHART_TITLE.fullmatch(title) for title in page.evaluate(FIGURE_TITLES))
    page.wait_for_function(f"() => ({TABLE})(document.querySelector({json.dumps(replay_tab(shapes))}))"
                           f".rows.length == {len(cli['rows'])}", timeout=30_000)
    table = tab.evaluate(TABLE)
    header = table["header"]
    assert header[:3] == ["op", "signature", "calls"] and header[-3:] == ["bound", "status", "reason"], header
    (trace_title,) = [title for title in header if title.startswith("trace (")]
    unit = UNITS[trace_title.removeprefix("trace (").removesuffix(")")]
    assert [title.split(" (")[0] for title in header if title.startswith(("eager (", "bf16 (", "compile ("))] == [
        *VARIANTS]  # a time column for each variant timed, none for compile
    cells = [dict(zip(header, row, strict=True)) for row in table["rows"]]
    assert [(c["op"], c["signature"], int(c["calls"].replace(",", "")), c["status"], c["reason"]) for c in cells] == [
        (r["name"], r["signature"], r["calls"], r["status"], r["reason"]) for r in cli["rows"]]
    for shown, row in zip(cells, cli["rows"], strict=True):
        assert float(shown[trace_title].replace(",", "")) * unit == pytest.approx(row["trace_ns"], rel=1e-3, abs=unit)
        for variant in VARIANTS:  # timed again, so not the CLI's figure: present where the CLI's is
            (title,) = [t for t in header if t.startswith(f"{variant} (")]
            assert (shown[title] != "") == (row[f"replay_{variant}_ns"] is not None), (variant, shown, row)
    assert tab.locator(".jp-Workbench-viewStatus").is_hidden()
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "replay-panel.png"))

    # a narrower window: the tab asks for a narrower layout, drawn from the job's result (no replay runs again)
    first = layout_width(views[-1])
    with page.expect_response(lambda r: "/workbench/api/replay/" in r.url, timeout=30_000) as narrower:
        page.set_viewport_size({"width": 1100, "height": 950})
    assert narrower.value.ok
    assert layout_width(narrower.value.url) <= first - 300, (first, narrower.value.url)
    tab.locator(".jp-Workbench-viewStatus").wait_for(state="hidden", timeout=30_000)
    assert canvases(page, replay_tab(shapes)) > 0
    jobs = json.loads(page.evaluate(f"fetch('/workbench/api/jobs?token={lab.token}').then(r => r.text())"))["jobs"]
    assert sum("replay" in job["request"] and job["request"]["replay"]["run"] == shapes for job in jobs) == 1
    assert page.seen.errors == []
    assert page.seen.dialogs == []

