"""The panel's SQL results, run names and sweeps in a real `jupyter lab` with headless Chromium.

A query over an imported real GPU trace (../shared/fixtures/kineto/resnet50_v100_train) opens in the main area with
every column in view and the covered run named; a click on a numeric header sorts by value; the CSV download holds
the rows as shown. Two imports of that trace under long names both show in full in the runs list. A sweep started
from the capture form (Batch "1,2", after "1,,x" is refused as it is typed) lands as two runs labelled with their
batch, and their comparison is drawn against the baseline picked beside the Compare button. Screenshots go to
docs/images/panel-sql.png and docs/images/panel-sweep.png."""

# ruff: noqa: F811 (the Lab fixtures imported below are used as fixture parameters of the same names)
from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import fixture_path
from test_lab_browser import (  # the same Lab server, browser and panel fixtures
    CAPTURE_TIMEOUT_MS,
    TINY_FORM,
    Lab,  # noqa: F401
    browser,  # noqa: F401
    fill_form,
    lab,  # noqa: F401
    page,  # noqa: F401
    pytestmark,  # noqa: F401
    run_row,
    wait_for_plots,
)

from workbench.imports import import_traces

expect = pytest.importorskip("playwright.sync_api").expect

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
TRACE = "resnet50_v100_train.pt.trace.json.gz"
NAMES = ("resnet50_v100_train_before_the_change", "resnet50_v100_train_after_the_change")
"""Two imports of one trace under names that share their first 20 characters: the list must tell them apart."""
QUERY = ("SELECT name, count(*) AS calls, sum(dur_ns) AS total_ns, min(dur_ns) AS min_ns, max(dur_ns) AS max_ns, "
         "max(dur_ns) - min(dur_ns) AS spread_ns\nFROM events WHERE kind = 'kernel' GROUP BY name ORDER BY name")
COLUMNS = ["name", "calls", "total_ns", "min_ns", "max_ns", "spread_ns"]
DIV_TEXTS = "() => Bokeh.documents.flatMap((d) => [...d.all_models].filter((m) => m.type == 'Div').map((m) => m.text))"


def raw_kernel_calls() -> Counter:
    """Launches per kernel name, straight from the raw gzipped Kineto JSON (the 2021 format's `Kernel` category)."""
    with gzip.open(fixture_path("kineto", TRACE), "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return Counter(e["name"] for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel")


@pytest.fixture(scope="module")
def imported(lab, tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("named")
    files = [folder / f"{name}.pt.trace.json.gz" for name in NAMES]
    for file in files:
        shutil.copyfile(fixture_path("kineto", TRACE), file)
    return import_traces(files, lab.traces)


def column(page, index: int) -> list[str]:
    return page.locator(f"#workbench-query-result tbody tr td:nth-child({index + 1})").all_text_contents()


def test_query_result_in_the_main_area(lab, page, imported):
    sidebar = page.locator("#jp-workbench-sidebar")
    sidebar.get_by_role("button", name="Refresh", exact=True).click()
    for run in imported:
        run_row(page, run).wait_for(timeout=30_000)
    # full names: the two imports are told apart, their names never cut, the id in the tooltip
    for run, name in zip(imported, NAMES, strict=True):
        button = run_row(page, run).locator(".jp-Workbench-runName")
        assert button.text_content() == name
        assert button.evaluate("(b) => b.scrollWidth <= b.clientWidth + 1")
        assert run in (button.get_attribute("title") or "") and name in button.get_attribute("title")

    first = imported[0]
    run_row(page, first).get_by_role("checkbox").check()
    sidebar.locator("summary", has_text="Query (SQL)").click()
    scope = sidebar.locator(".jp-Workbench-queryScope")
    assert f"the 1 selected run: {NAMES[0]}" in scope.text_content()  # says what it will cover, before it runs
    sidebar.get_by_label("SQL query").fill(QUERY)
    with page.expect_response(lambda r: "/workbench/api/query" in r.url, timeout=120_000) as answer:
        sidebar.get_by_role("button", name="Run query").click()
    reply = answer.value.json()
    view = page.locator("#workbench-query-result")
    view.locator(".jp-Workbench-queryTable tbody tr").first.wait_for(timeout=60_000)

    # the result is a main-area tab, every column in view, the covered run named (by name, with its id)
    assert page.locator("#jp-main-dock-panel #workbench-query-result").count() == 1
    assert reply["columns"] == COLUMNS and [row["run"] for row in reply["runs"]] == [first]
    headers = view.locator("thead th")
    assert headers.all_text_contents() == COLUMNS
    box = view.locator(".jp-Workbench-queryScroll").bounding_box()
    for i in range(len(COLUMNS)):
        cell = headers.nth(i).bounding_box()
        assert box["x"] <= cell["x"] and cell["x"] + cell["width"] <= box["x"] + box["width"] + 1, COLUMNS[i]
    covered = view.locator(".jp-Workbench-queryRun")
    assert covered.all_text_contents() == [NAMES[0]] and covered.first.get_attribute("data-run") == first
    expected = raw_kernel_calls()
    assert f"{len(expected)} rows" in view.locator(".jp-Workbench-queryCount").text_content()
    assert dict(zip(column(page, 0), (int(c.replace(",", "")) for c in column(page, 1)), strict=True)) == expected

    # sorting: numbers by value, largest first on the first click, then smallest first
    view.get_by_role("button", name="calls").click()
    calls = [int(text.replace(",", "")) for text in column(page, 1)]
    assert calls == sorted(expected.values(), reverse=True)
    assert headers.nth(1).get_attribute("aria-sort") == "descending"
    view.get_by_role("button", name="calls").click()
    calls = [int(text.replace(",", "")) for text in column(page, 1)]
    assert calls == sorted(expected.values())
    page.wait_for_timeout(300)
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "panel-sql.png"))

    # the CSV holds the rows as shown (the query's rows, stably sorted by calls), names with commas quoted
    with page.expect_download() as download:
        view.get_by_role("button", name="Download CSV").click()
    text = Path(download.value.path()).read_text(encoding="utf-8")
    shown = sorted(reply["rows"], key=lambda row: row[1])
    assert list(csv.reader(io.StringIO(text, newline=""))) == [COLUMNS] + [[str(v) for v in row] for row in shown]
    assert any("," in row[0] for row in shown)  # kernel names with commas: quoted fields were needed
    assert page.seen.errors == []


def test_a_sweep_from_the_form(lab, page):
    sidebar = page.locator("#jp-workbench-sidebar")
    # a slip shows under the field as it is typed, before any request
    fill_form(page, {**TINY_FORM, "variants": "eager", "batch": "1,,x"})
    error = sidebar.locator("#jp-Workbench-capture-batch-error")
    expect(error).to_contain_text('batch: expected a whole number from 1 to 4096, or several separated by commas')
    assert '"1,,x"' in error.text_content()
    fill_form(page, {"batch": "1,2"})
    assert error.count() == 0
    assert sidebar.locator(".jp-Workbench-sweepNote").text_content() == "Sweep: 2 shapes × 1 variant = 2 runs"
    page.locator("#jp-Workbench-capture-profile").uncheck()  # the cheapest capture: benchmark only

    sidebar.get_by_role("button", name="Capture", exact=True).click()
    outcome = sidebar.locator(".jp-Workbench-outcome")
    outcome.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "jp-mod-succeeded" in (outcome.get_attribute("class") or ""), f"{outcome.text_content()} {lab.log_tail()}"
    assert "Captured 2 runs" in outcome.text_content()

    group = sidebar.locator(".jp-Workbench-group", has_text="tiny-gpt").first
    rows = group.locator(".jp-Workbench-run")
    rows.nth(1).wait_for(timeout=30_000)
    labels = {}
    for i in range(rows.count()):
        run = rows.nth(i).get_attribute("data-run")
        labels[run] = rows.nth(i).locator(".jp-Workbench-runName").text_content()
    # each run is labelled with the batch it ran at, as its run.json records it
    batches = {run: json.loads((lab.traces / run / "run.json").read_text())["batch"] for run in labels}
    assert sorted(batches.values()) == [1, 2]
    assert all(label == f"eager-b{batches[run]}" for run, label in labels.items()), labels
    assert all(f"batch {batches[run]}" in (run_row(page, run).get_attribute("title") or "") for run in labels)

    # compare them against the run picked as the baseline
    runs = list(labels)
    for run in runs:
        run_row(page, run).get_by_role("checkbox").check()
    baseline = next(run for run in runs if batches[run] == 2)
    sidebar.get_by_label("Compare against").select_option(baseline)
    sidebar.get_by_role("button", name="Compare", exact=True).click()
    view = f'[id^="workbench-view-"][id$="@{baseline}"]'  # the comparison against the chosen baseline
    wait_for_plots(page, view)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        texts = page.evaluate(DIV_TEXTS)
        if any("compared against" in text for text in texts):
            break
        page.wait_for_timeout(250)
    assert any("compared against eager-b2" in text for text in texts), texts

    # the sidebar widened by its splitter: the list uses the width, a run on one line
    name, p50 = (run_row(page, baseline).locator(f".jp-Workbench-{part}") for part in ("runName", "p50"))
    assert name.bounding_box()["y"] < p50.bounding_box()["y"] - 4  # narrow: the name has a line of its own
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first.bounding_box()
    page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + 200)
    page.mouse.down()
    page.mouse.move(handle["x"] + 300, handle["y"] + 200, steps=8)
    page.mouse.up()
    page.wait_for_timeout(500)
    assert sidebar.bounding_box()["width"] > 520
    assert abs(name.bounding_box()["y"] - p50.bounding_box()["y"]) < 8  # one line
    page.locator(f"{view} .jp-Workbench-viewStatus").wait_for(state="hidden", timeout=60_000)  # drawn at its width
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "panel-sweep.png"))
    assert page.seen.errors == []
