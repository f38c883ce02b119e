"""A run's trace for Perfetto from its dashboard in a real `jupyter lab`, driven with headless Chromium: "Download for
Perfetto" and "Chrome JSON" save `<run>.perfetto-trace` and `<run>.json`, which read back with the fixture's kernels
(counted from the raw file); "Open in Perfetto UI" opens ui.perfetto.dev and posts it the same Perfetto trace by
the PING/PONG protocol. The real UI cannot be reached here (no internet): a page that answers as Perfetto's does is
routed in its place (nothing leaves the machine) and records what it is posted, as the report's test does
(`test_perfetto_browser.py`)."""
# ruff: noqa: F811  (the Lab fixtures, imported from test_lab_browser, are the tests' arguments)

from __future__ import annotations

import gzip
import json

import pytest
from conftest import fixture_path
from test_lab_browser import (  # noqa: F401 (browser, lab, page: the fixtures of Chromium, a Lab and its page)
    browser,
    lab,
    page,
    pytestmark,
    run_row,
    shot,
    view_selector,
)
from test_perfetto_browser import FAKE_UI

from workbench.trace.registry import read_trace

FIXTURE = ("kineto", "amd_mi250_train.json.gz")


@pytest.fixture(scope="module")
def run(lab) -> str:
    """A small ROCm training trace imported into the Lab's traces folder."""
    from workbench.imports import import_traces

    (run_id,) = import_traces([fixture_path(*FIXTURE)], lab.traces)
    return run_id


def raw_kernels() -> int:
    """The kernel records of the raw fixture."""
    with gzip.open(fixture_path(*FIXTURE), "rt") as f:
        events = json.load(f)["traceEvents"]
    return sum(event.get("ph") == "X" and event.get("cat") == "kernel" for event in events)


def kernels(path) -> int:
    events = read_trace(path).events.select(["kind"]).to_pandas()
    return int((events["kind"].astype(str) == "kernel").sum())


def test_the_dashboard_downloads_and_opens_the_trace_in_perfetto(lab, page, run, tmp_path):
    page.context.route("https://ui.perfetto.dev/**",
                       lambda route: route.fulfill(content_type="text/html", body=FAKE_UI))
    run_row(page, run).locator(".jp-Workbench-runName").click()
    dashboard = page.locator(view_selector([run]))
    download_button = dashboard.get_by_role("button", name="Download for Perfetto")
    download_button.wait_for(timeout=30_000)
    shot(page, "61-export-toolbar")

    saved = {}
    for name, suffix in (("Download for Perfetto", ".perfetto-trace"), ("Chrome JSON", ".json")):
        with page.expect_download(timeout=60_000) as download:
            dashboard.get_by_role("button", name=name).click()
        assert download.value.suggested_filename == f"{run}{suffix}"
        saved[suffix] = tmp_path / download.value.suggested_filename
        download.value.save_as(saved[suffix])
        assert kernels(saved[suffix]) == raw_kernels() == 14
    assert "traceEvents" in json.loads(saved[".json"].read_text())  # Chrome Trace Event JSON

    with page.context.expect_page(timeout=30_000) as opened:
        dashboard.get_by_role("button", name="Open in Perfetto UI").click()
    ui = opened.value
    assert ui.url.startswith("https://ui.perfetto.dev")
    ui.wait_for_function("() => window.__got !== undefined", timeout=60_000)
    got = ui.evaluate("() => window.__got")
    perfetto = saved[".perfetto-trace"].read_bytes()
    assert got["bytes"] == len(perfetto)
    assert bytes(got["head"]) == perfetto[:4]
    assert got["file"] == f"{run}.perfetto-trace"
    assert got["title"].startswith("workbench: ")
    assert page.seen.errors == []
    assert page.seen.dialogs == []
