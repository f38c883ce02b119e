"""The Workbench panel in a real `jupyter lab`, driven with headless Chromium: the traces folder setting reaches
the server, a capture of a tiny model runs with a live progress bar, its dashboard and a comparison draw with
BokehJS and follow the panel's width, a run is deleted from the list and from disk, errors show in the panel,
and names from runs are rendered as text. Screenshots go to test-output/lab/."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import PAYLOADS, payload_trace

from workbench.trace import read_trace
from workbench.trace.store.bundle import write_bundle

pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e .[lab])")

from jupyter_core.paths import jupyter_path

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "lab"
TINY_FORM = {"model": "tiny-gpt", "variants": "eager,bf16", "batch": "2", "seq": "8", "iterations": "3",
             "warmup": "1", "threads": "1", "overrides": "d_model=32 layers=1 heads=2"}
"""The capture form filled for `conftest.TINY_CAPTURE`'s model: a capture of seconds (mostly importing torch)."""
CAPTURE_TIMEOUT_MS = 300_000
"""A safety cap for the capture, not a timing check: generous for two busy cores."""
COUNT_CANVASES = """(root) => {
  const count = (node) => node.querySelectorAll('canvas').length +
    [...node.querySelectorAll('*')].filter(e => e.shadowRoot).map(e => count(e.shadowRoot)).reduce((a, b) => a + b, 0);
  return count(root);
}"""
"""Canvases under an element, Bokeh's shadow DOMs included."""


def built_labextension() -> Path | None:
    """The installed labextension of the panel, if `pip install` built and installed it."""
    for folder in jupyter_path("labextensions"):
        package = Path(folder) / "jupyterlab-workbench" / "package.json"
        if package.is_file():
            return package.parent
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"),
    pytest.mark.skipif(built_labextension() is None,
                       reason="the jupyterlab-workbench labextension is not built and installed (pip install -e .)"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Lab:
    """A `jupyter lab` server in a subprocess, with its own root, settings and traces folders."""

    def __init__(self, base: Path) -> None:
        self.root_dir = base / "root"
        self.env_traces = base / "env-traces"
        self.traces = self.root_dir / "lab-traces"
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = SCREENSHOTS / "jupyter-lab.log"
        settings = base / "settings"
        for folder in (self.root_dir, self.env_traces, settings / "jupyterlab-workbench",
                       settings / "@jupyterlab" / "apputils-extension"):
            folder.mkdir(parents=True, exist_ok=True)
        # the traces folder setting, relative to root_dir: the server must use it, not $WORKBENCH_TRACES
        (settings / "jupyterlab-workbench" / "plugin.jupyterlab-settings").write_text(
            json.dumps({"tracesRoot": "lab-traces"}))
        (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.env = {**os.environ, "WORKBENCH_TRACES": str(self.env_traces), "JUPYTERLAB_SETTINGS_DIR": str(settings),
                    "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"), "JUPYTER_CONFIG_DIR": str(base / "config")}
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
                   f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
                   "--ServerApp.jpserver_extensions={'workbench.server': True}"]
        if os.geteuid() == 0:
            command.append("--allow-root")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("w")
        self.process = subprocess.Popen(command, env=self.env, cwd=self.root_dir, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"jupyter lab exited with code {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"jupyter lab did not answer on {self.url}: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # its own session: the server and its capture jobs
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    server = Lab(tmp_path_factory.mktemp("lab"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


class Seen:
    """What the page did besides what the test asked: errors, dialogs, dashboard requests."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.layout_requests: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" and _ours(m.text) else None)
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: self.layout_requests.append(r.url) if "/dashboard?width=" in r.url else None)


def _ours(text: str) -> bool:
    """A console error from the panel or Bokeh (the rest of Lab may log its own, e.g. without a network)."""
    return any(word in text.lower() for word in ("workbench", "bokeh"))


@pytest.fixture
def page(lab, browser):
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    page = context.new_page()
    page.seen = Seen(page)
    page.goto(f"{lab.url}/lab/workspaces/{secrets.token_hex(4)}?token={lab.token}")  # a fresh layout each time
    page.locator('li[data-id="jp-workbench-sidebar"]').wait_for(timeout=90_000)
    page.locator('li[data-id="jp-workbench-sidebar"]').click()
    page.locator("#jp-workbench-sidebar .jp-Workbench-root").wait_for(timeout=30_000)
    yield page
    context.close()


def shot(page, name: str) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def canvases(page, selector: str) -> int:
    return page.locator(selector).evaluate(COUNT_CANVASES)


def wait_for_plots(page, selector: str) -> None:
    """Wait until BokehJS has drawn canvases inside `selector`; fail with the view's status text if it cannot."""
    try:
        page.wait_for_function(f"() => ({COUNT_CANVASES})(document.querySelector({json.dumps(selector)}) ?? "
                               "document.createElement('div')) > 0", timeout=120_000)
    except playwright.TimeoutError:
        status = page.locator(f"{selector} .jp-Workbench-viewStatus").text_content()
        pytest.fail(f"no plots drew in {selector}: {status!r}")


def fill_form(page, values: dict[str, str]) -> None:
    for name, value in values.items():
        page.locator(f"#jp-Workbench-capture-{name}").fill(value)


def run_row(page, run_id: str):
    return page.locator(f'#jp-workbench-sidebar .jp-Workbench-run[data-run="{run_id}"]')


def layout_width(url: str) -> int:
    """The width a dashboard request asked for."""
    return int(parse_qs(urlsplit(url).query)["width"][0])


def view_selector(runs: list[str]) -> str:
    return f'[id="workbench-view-{"+".join(runs)}"]'


def test_capture_open_compare_delete(lab, page):
    sidebar = page.locator("#jp-workbench-sidebar")
    # the traces folder setting was sent to the server: it lists (and captures into) root_dir/lab-traces
    page.wait_for_function("(root) => document.querySelector('#jp-workbench-sidebar .jp-Workbench-rootPath')"
                           "?.textContent === root", arg=lab.traces.relative_to(lab.root_dir).as_posix(),
                           timeout=30_000)  # as the setting names it: the server sends no absolute path
    # its entries: a launcher card and command-palette items
    page.locator(".jp-LauncherCard", has_text="Workbench").wait_for(timeout=30_000)
    page.keyboard.press("Control+Shift+C")
    page.locator(".lm-CommandPalette-input").fill("workbench")
    labels = page.locator(".lm-CommandPalette-item .lm-CommandPalette-itemLabel")
    labels.first.wait_for()
    assert {"Workbench", "Refresh Workbench Runs"} <= set(labels.all_text_contents())
    page.keyboard.press("Escape")

    fill_form(page, TINY_FORM)
    shot(page, "01-capture-form")

    sidebar.get_by_role("button", name="Capture", exact=True).click()
    progress = sidebar.get_by_role("progressbar")
    progress.wait_for(timeout=30_000)
    tasks_seen = {sidebar.locator(".jp-Workbench-task").text_content()}
    shot(page, "02-capture-progress")
    assert sidebar.get_by_role("button", name="Cancel").is_visible()

    outcome = sidebar.locator(".jp-Workbench-outcome")
    deadline = time.monotonic() + CAPTURE_TIMEOUT_MS / 1000
    while not outcome.is_visible() and time.monotonic() < deadline:
        task = sidebar.locator(".jp-Workbench-task")
        if task.count():
            with contextlib.suppress(playwright.TimeoutError):  # the line went away between count() and its text
                tasks_seen.add(task.text_content(timeout=1000))
        page.wait_for_timeout(250)
    assert outcome.is_visible(), f"the capture did not end: {lab.log_tail()}"
    assert "jp-mod-succeeded" in (outcome.get_attribute("class") or ""), outcome.text_content()
    assert "Captured 2 runs" in outcome.text_content()
    assert tasks_seen - {None, "starting"}  # the bar followed the job past its start
    # what the bar could show: the job went through every task (a warm capture of this size passes them all
    # within a second, faster than the panel polls, so the bar itself may show only some)
    with urllib.request.urlopen(f"{lab.url}/workbench/api/jobs?token={lab.token}", timeout=30) as reply:
        (job,) = [j for j in json.load(reply)["jobs"] if j["status"] == "succeeded"]
    assert {"prepare", "benchmark", "profile eager", "profile bf16", "write"} <= set(job["progress"]["tasks"])

    rows = sidebar.locator(".jp-Workbench-run")
    rows.nth(1).wait_for(timeout=30_000)
    run_ids = [rows.nth(i).get_attribute("data-run") for i in range(rows.count())]
    assert len(run_ids) == 2
    assert all((lab.traces / run / "run.json").is_file() for run in run_ids)
    assert not any(lab.env_traces.iterdir())  # nothing went to the server's default root
    group = sidebar.locator(".jp-Workbench-group")
    assert group.count() == 1
    assert group.locator(".jp-Workbench-groupTitle").text_content() == "tiny-gpt"
    assert all(rows.nth(i).locator(".jp-Workbench-p50").text_content().endswith(" ms") for i in range(2))

    # a run's dashboard, drawn by BokehJS from the server's static route
    names = {run: run_row(page, run).locator(".jp-Workbench-runName").text_content() for run in run_ids}
    eager = next(run for run, name in names.items() if name == "eager")
    other = next(run for run in run_ids if run != eager)
    assert sorted(names.values()) == ["bf16", "eager"]
    run_row(page, eager).locator(".jp-Workbench-runName").click()
    dashboard = view_selector([eager])
    wait_for_plots(page, dashboard)
    assert page.evaluate("() => window.Bokeh.documents.length") >= 1
    shot(page, "03-dashboard")

    # narrower panel: the dashboard is laid out again at the new width
    widths = [layout_width(url) for url in page.seen.layout_requests]
    page.set_viewport_size({"width": 1100, "height": 950})
    deadline = time.monotonic() + 60
    while len(page.seen.layout_requests) == len(widths) and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    relaid = [layout_width(url) for url in page.seen.layout_requests]
    assert len(relaid) > len(widths), "the dashboard was not fetched again after the panel shrank"
    assert relaid[-1] < widths[-1] - 300
    wait_for_plots(page, dashboard)
    page.set_viewport_size({"width": 1500, "height": 950})

    # compare the two runs
    for run in (eager, other):
        run_row(page, run).get_by_role("checkbox").check()
    sidebar.get_by_role("button", name="Compare", exact=True).click()
    comparison = view_selector([eager, other])
    wait_for_plots(page, comparison)
    page.wait_for_timeout(500)
    shot(page, "04-compare")

    # delete one run: confirmed in a dialog, gone from the list, from disk, and its views closed
    run_row(page, eager).get_by_role("checkbox").uncheck()
    sidebar.get_by_role("button", name="Delete", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert other in dialog.text_content()
    shot(page, "05-delete-dialog")
    dialog.get_by_role("button", name="Delete").click()
    run_row(page, other).wait_for(state="detached", timeout=30_000)
    assert not (lab.traces / other).exists()
    assert (lab.traces / eager / "run.json").is_file()
    page.locator(comparison).wait_for(state="detached", timeout=10_000)
    assert page.locator(dashboard).count() == 1
    shot(page, "06-after-delete")

    assert page.seen.errors == []
    assert page.seen.dialogs == []


def test_errors_show_in_the_panel(lab, page):
    sidebar = page.locator("#jp-workbench-sidebar")
    fill_form(page, {**TINY_FORM, "batch": "0"})
    sidebar.get_by_role("button", name="Capture", exact=True).click()
    error = sidebar.locator(".jp-Workbench-capture .jp-Workbench-error")
    error.wait_for()
    assert "batch: expected a whole number from 1" in error.text_content()

    fill_form(page, {**TINY_FORM, "model": "no_such_module:build"})  # the server runs built-in models only
    sidebar.get_by_role("button", name="Capture", exact=True).click()
    page.wait_for_function("document.querySelector('#jp-workbench-sidebar .jp-Workbench-capture "
                           ".jp-Workbench-error')?.textContent.includes('no_such_module')")
    assert "allowed_factory_modules" in error.text_content()

    fill_form(page, {**TINY_FORM, "overrides": "d_model=30 layers=1 heads=4"})  # fails in the job
    sidebar.get_by_role("button", name="Capture", exact=True).click()
    failed = sidebar.locator(".jp-Workbench-outcome.jp-mod-failed")
    failed.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "Capture failed:" in failed.text_content()
    assert "not divisible by heads" in failed.text_content()
    assert error.count() == 0  # the form's old error went away with the new attempt
    shot(page, "07-capture-failed")
    assert page.seen.errors == []


def test_names_from_runs_are_text(lab, page, tmp_path):
    trace = read_trace(payload_trace(tmp_path / "evil.json"))
    info = {"model": {"name": PAYLOADS[1]}, "variant": {"name": PAYLOADS[0]}, "device": PAYLOADS[0],
            "benchmark": {"p50": 1.25}}
    write_bundle(lab.traces, "evil-run", info, trace)
    sidebar = page.locator("#jp-workbench-sidebar")
    sidebar.get_by_role("button", name="Refresh", exact=True).click()
    row = run_row(page, "evil-run")
    row.wait_for(timeout=30_000)
    assert row.locator(".jp-Workbench-runName").text_content() == PAYLOADS[0]
    assert row.locator(".jp-Workbench-device").text_content() == PAYLOADS[0]
    row.locator(".jp-Workbench-runName").click()
    wait_for_plots(page, view_selector(["evil-run"]))  # op and kernel names are payloads too
    assert page.locator(f"{view_selector(['evil-run'])} img").count() == 0
    assert page.evaluate("() => window.__pwned === undefined")
    assert page.seen.dialogs == []
    assert page.seen.errors == []
