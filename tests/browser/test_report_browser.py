"""The generated report in headless Chromium: plots draw, no console errors, no network, no injection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_CAPTURE, payload_report

from workbench.cli import main

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="Debian's chromium is not installed (apt-get install chromium)")
COUNT_CANVASES = """() => {
  const count = (root) => root.querySelectorAll('canvas').length +
    [...root.querySelectorAll('*')].filter(e => e.shadowRoot).map(e => count(e.shadowRoot)).reduce((a, b) => a + b, 0);
  return count(document);
}"""
"""Canvases in the page, Bokeh's shadow DOMs included."""
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def open_in_browser(html: Path, click_tab: str | None = None) -> dict:
    """Load a report from disk; return console errors, requests that left the file, dialogs, canvases."""
    seen: dict = {"errors": [], "requests": [], "dialogs": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: seen["errors"].append(str(e)))
        page.on("request", lambda r: seen["requests"].append(r.url) if not r.url.startswith("file:") else None)
        page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
        page.goto(html.as_uri())
        page.wait_for_function("() => document.querySelectorAll('.bk-Canvas, canvas').length > 0 || "
                               "document.querySelector('[class*=bk-]') !== null", timeout=20_000)
        page.wait_for_timeout(1500)
        if click_tab:
            page.get_by_text(click_tab, exact=True).first.click()
            page.wait_for_timeout(800)
        seen["canvases"] = page.evaluate(COUNT_CANVASES)
        seen["pwned"] = page.evaluate("() => window.__pwned === 1")
        browser.close()
    return seen


def test_experiment_report_draws_offline(tmp_path):
    root = tmp_path / "traces"
    report = tmp_path / "experiment.html"
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root),
                                       "--report", str(report), "--json"])
    assert result.exit_code == 0, result.output
    seen = open_in_browser(report, click_tab="bf16")
    assert seen["errors"] == []
    assert seen["requests"] == []
    assert seen["canvases"] > 0


def test_injected_names_do_not_execute(tmp_path):
    seen = open_in_browser(payload_report(tmp_path))
    assert seen["dialogs"] == []
    assert seen["pwned"] is False
    assert seen["errors"] == []
    assert seen["canvases"] > 0
