"""The panel's Serving section in a real `jupyter lab`, driven with headless Chromium: a mistake in the form shows
the server's message; a serving run against a small OpenAI-compatible server on 127.0.0.1 (it lists a model and
answers every completion 500) runs as a job, ends with its failed requests counted, and lists its run, which opens
its dashboard. Screenshots go to test-output/lab/."""
# ruff: noqa: F811  (the Lab fixtures, imported from test_lab_browser, are the tests' arguments)

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_lab_browser import (  # noqa: F401 (browser, page: the fixtures of Chromium and a Lab page)
    Lab,
    browser,
    page,
    run_row,
    shot,
    view_selector,
    wait_for_plots,
)
from test_lab_browser import pytestmark as lab_marks
from test_serving_errors import AIPERF, SERVING, stub_server

pytestmark = [*lab_marks, pytest.mark.skipif(not AIPERF.is_file(), reason=f"no AIPerf in {SERVING}: run make serving")]
SERVE_TIMEOUT_MS = 180_000
"""A safety cap for the serving job (AIPerf starting and sending 2 requests takes seconds), not a timing check."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    """A `jupyter lab` whose jobs find AIPerf (its root_dir, where jobs run, has no .serving of its own) and
    whose root_dir holds a tokenizer folder, `tok`."""
    from workbench.serving.model_folder import word_tokenizer

    server = Lab(tmp_path_factory.mktemp("lab"))
    server.env["WORKBENCH_SERVING"] = str(SERVING.resolve())
    word_tokenizer(64).save_pretrained(server.root_dir / "tok")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    with stub_server() as url:
        yield url


def fill(page, values: dict[str, str]) -> None:
    for name, value in values.items():
        page.locator(f"#jp-Workbench-serve-{name}").fill(value)


def test_a_serving_run_from_the_panel(lab, page, stub):
    sidebar = page.locator("#jp-workbench-sidebar")
    sidebar.locator(".jp-Workbench-serveSection > summary").click()
    section = sidebar.get_by_role("region", name="Serving")
    start = section.get_by_role("button", name="Start", exact=True)

    # a mistake the server finds: its message, in place, with no path of the server
    fill(page, {"url": stub, "tokenizer": "missing", "model": "stub", "loads": "20", "requests": "2", "isl": "8",
                "osl": "4", "slo": "ttft=200ms"})
    start.click()
    error = section.locator(".jp-Workbench-error")
    error.wait_for(timeout=30_000)
    assert "tokenizer: 'missing' is no folder under the server's root folder" in error.text_content()
    assert str(lab.root_dir) not in error.text_content()

    # a form mistake found before anything is sent
    fill(page, {"tokenizer": "tok", "requests": "0"})
    start.click()
    page.wait_for_function("() => document.querySelector('#jp-workbench-sidebar .jp-Workbench-serve "
                           ".jp-Workbench-error')?.textContent.startsWith('requests: expected a whole number')")

    fill(page, {"requests": "2"})
    shot(page, "30-serve-form")
    start.click()
    outcome = section.locator(".jp-Workbench-serveOutcome")
    section.get_by_role("progressbar").or_(outcome).first.wait_for(timeout=30_000)
    assert error.count() == 0  # the last attempt's error went away
    if section.get_by_role("progressbar").count():
        shot(page, "31-serve-running")
    outcome.wait_for(timeout=SERVE_TIMEOUT_MS)
    shot(page, "32-serve-ended")
    assert "jp-mod-failed" in (outcome.get_attribute("class") or ""), outcome.text_content()
    text = outcome.text_content()
    assert "Serving run ended with failures (2 of 2 requests failed): 1 run kept" in text, text

    # its run is listed under the outcome and in the runs list; a click opens its dashboard
    listed = outcome.locator("li[data-run]")
    assert listed.count() == 1 and "0 ok, 2 failed" in listed.text_content()
    run = listed.get_attribute("data-run")
    assert (lab.traces / run / "run.json").is_file()
    run_row(page, run).wait_for(timeout=30_000)
    listed.get_by_role("button", name="rate-20").click()
    wait_for_plots(page, view_selector([run]))
    shot(page, "33-serve-dashboard")
    assert page.seen.errors == []
    assert page.seen.dialogs == []
