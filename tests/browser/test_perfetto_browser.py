"""The report's "Open in Perfetto" button in headless Chromium: it opens ui.perfetto.dev and hands it the run's
trace by Perfetto's PING/PONG postMessage protocol. The UI is stood in for by a page that answers as Perfetto's
does (routed, so nothing leaves the machine) and records the trace it is posted."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import payload_trace

from workbench.cli import main

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="Debian's chromium is not installed (apt-get install chromium)")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
FAKE_UI = """<html><body><script>
window.addEventListener("message", (event) => {
  if (event.data === "PING") { event.source.postMessage("PONG", "*"); return; }
  if (event.data && event.data.perfetto) {
    const got = event.data.perfetto;
    window.__got = {bytes: got.buffer.byteLength, title: got.title, file: got.fileName,
                    head: Array.from(new Uint8Array(got.buffer.slice(0, 4)))};
  }
});
</script></body></html>"""


def test_open_in_perfetto_posts_the_trace(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(payload_trace(tmp_path / "payload.json")), "--out", str(root)])
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip()
    report = tmp_path / "report.html"
    result = runner.invoke(main, ["report", run_id, "--out", str(root), "-o", str(report)])
    assert result.exit_code == 0, result.output
    trace = tmp_path / f"report.{run_id}.perfetto-trace"
    assert trace.is_file()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context()
        context.route("https://ui.perfetto.dev/**", lambda route: route.fulfill(content_type="text/html",
                                                                                  body=FAKE_UI))
        page = context.new_page()
        page.goto(report.as_uri())
        button = page.get_by_role("button", name=re.compile(r"^Open .+ in Perfetto$"))
        button.wait_for(timeout=20_000)
        assert page.get_by_role("link", name=trace.name).get_attribute("download") is not None
        with context.expect_page() as opened:
            button.click()
        ui = opened.value
        ui.wait_for_function("() => window.__got !== undefined", timeout=10_000)
        got = ui.evaluate("() => window.__got")
        pwned = page.evaluate("() => window.__pwned === 1")
        browser.close()
    assert got["bytes"] == trace.stat().st_size
    assert bytes(got["head"]) == trace.read_bytes()[:4]
    assert got["file"] == trace.name and got["title"].startswith("workbench: ")
    assert not pwned
