"""The Workbench panel manages runs, in a real `jupyter lab` driven with headless Chromium: a real GPU trace
imported with the Import button appears in the runs list under its file name, a dropped file is imported too,
runs written by someone else appear without a refresh, "Open in Workbench" in Lab's file browser imports a file
and opens its dashboard, tabs are named by model, variant and batch, the query box runs SQL over the runs, and
a reload during a capture shows the running job's settings. Screenshots go to test-output/lab/."""
# ruff: noqa: F811  (the Lab fixtures, imported from test_lab_browser, are the tests' arguments)

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from conftest import fixture_path, load_raw, write_trace
from test_lab_browser import (  # noqa: F401 (browser, lab, page: the fixtures of a jupyter lab and Chromium)
    browser,
    lab,
    page,
    run_row,
    shot,
    view_selector,
    wait_for_plots,
)
from test_lab_browser import pytestmark as lab_marks

from workbench.trace import read_trace
from workbench.trace.store.bundle import write_bundle
from workbench.trace.store.records import TRACE_SUFFIXES

pytestmark = lab_marks  # slow; skipped without Chromium or the built labextension
RESNET = ("kineto", "resnet50_v100_train.pt.trace.json.gz")
AMD = ("kineto", "amd_mi250_train.json.gz")
TRITON = ("kineto", "triton_example.json.gz")
IMPORT_TIMEOUT_MS = 180_000
"""A safety cap for an import job (a subprocess reading the trace), not a timing check."""


def shown(path: Path) -> str:
    """How the panel names an import of `path`: its file less the trace suffix (`records.display_name`)."""
    return next((path.name[: -len(suffix)] for suffix in TRACE_SUFFIXES if path.name.endswith(suffix)), path.name)


def row_named(page, path: Path):
    """The run whose list entry names the import of `path`."""
    return page.locator("#jp-workbench-sidebar .jp-Workbench-run", has=page.locator(
        ".jp-Workbench-runName", has_text=shown(path)))


def api(lab, method: str, path: str, body=None):
    request = urllib.request.Request(f"{lab.url}/workbench/api/{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def test_import_open_and_query_runs(lab, page, tmp_path):
    sidebar = page.locator("#jp-workbench-sidebar")
    resnet = fixture_path(*RESNET)

    # the Import button uploads a real GPU trace; the run appears under its file name
    page.locator(".jp-Workbench-importInput").set_input_files(str(resnet))
    sidebar.locator(".jp-Workbench-import.jp-mod-done", has_text=resnet.name).wait_for(timeout=IMPORT_TIMEOUT_MS)
    imported = row_named(page, resnet)
    imported.wait_for(timeout=30_000)
    run_id = imported.get_attribute("data-run")
    assert (lab.traces / run_id / "raw" / resnet.name).read_bytes() == resnet.read_bytes()
    assert not [p for p in lab.traces.iterdir() if p.name.startswith(".")]  # the upload is cleared away
    shot(page, "20-imported")

    # a file dropped on the panel is imported too
    amd = fixture_path(*AMD)
    data = page.evaluate_handle("""([name, bytes]) => {
        const transfer = new DataTransfer();
        transfer.items.add(new File([new Uint8Array(bytes)], name));
        return transfer;
    }""", [amd.name, list(amd.read_bytes())])
    panel = sidebar.locator(".jp-Workbench-panel")
    panel.dispatch_event("dragover", {"dataTransfer": data})
    assert sidebar.locator(".jp-Workbench-dropNote").is_visible()
    panel.dispatch_event("drop", {"dataTransfer": data})
    row_named(page, amd).wait_for(timeout=IMPORT_TIMEOUT_MS)

    # a run written by someone else (a terminal, a notebook) appears without pressing Refresh;
    # its tab is named by model, variant and batch
    trace = read_trace(write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 50}]))
    write_bundle(lab.traces, "from-terminal", {"model": {"name": "tiny-gpt"}, "variant": {"name": "eager"},
                                               "batch": 4, "device": "cpu", "benchmark": {"p50": 1.0}}, trace)
    run_row(page, "from-terminal").wait_for(timeout=30_000)
    run_row(page, "from-terminal").locator(".jp-Workbench-runName").click()
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="tiny-gpt · eager · b4")
    tab.wait_for(timeout=30_000)

    # the query box: kernels per run over every run, figures from the raw trace
    sidebar.locator(".jp-Workbench-querySection > summary").click()
    box = sidebar.get_by_role("textbox", name="SQL query")
    box.fill("SELECT r.file, count(*) AS kernels FROM events e JOIN runs r USING (run) "
             "WHERE e.kind = 'kernel' GROUP BY r.file ORDER BY r.file")
    sidebar.get_by_role("button", name="Run query").click()
    table = page.locator("#workbench-query-result .jp-Workbench-queryTable")  # the result opens in the main area
    table.wait_for(timeout=60_000)
    shot(page, "21-query")
    cells = [row.locator("td").all_text_contents() for row in table.locator("tbody tr").all()]
    kernels = {name: sum(1 for e in load_raw(fixture_path(*parts))["traceEvents"]
                         if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel"))
               for name, parts in ((resnet.name, RESNET), (amd.name, AMD))}
    assert {file: int(count.replace(",", "")) for file, count in cells} == kernels
    assert kernels[resnet.name] == 8772

    box.fill("COPY events TO 'stolen.csv'")  # read-only: one line in the panel, nothing written
    sidebar.get_by_role("button", name="Run query").click()
    error = sidebar.locator(".jp-Workbench-query .jp-Workbench-error")
    error.wait_for(timeout=30_000)
    assert "only SELECT" in error.text_content()
    assert not list(lab.root_dir.rglob("stolen.csv"))

    # "Open in Workbench" on a trace file in Lab's file browser imports it and opens its dashboard
    triton = fixture_path(*TRITON)
    (lab.root_dir / triton.name).write_bytes(triton.read_bytes())
    page.locator('li[data-id="filebrowser"]').click()
    item = page.locator(".jp-DirListing-item", has_text=triton.name)
    item.wait_for(timeout=30_000)
    item.click(button="right")
    page.locator(".lm-Menu-item", has_text="Open in Workbench").click()
    opened = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=shown(triton))
    opened.wait_for(timeout=IMPORT_TIMEOUT_MS)
    (run,) = [p.name for p in lab.traces.iterdir() if (p / "raw" / triton.name).is_file()]
    wait_for_plots(page, view_selector([run]))
    shot(page, "22-open-in-workbench")
    assert page.seen.errors == []


def test_a_reload_during_a_capture_shows_its_settings(lab, page):
    request = {"model": "mlp", "overrides": {"hidden": 32, "in_features": 16, "num_classes": 10},
               "variants": ["eager"], "batch": 3, "iterations": 100_000, "warmup": 0, "threads": 1, "profile": False}
    job = api(lab, "POST", "jobs", request)
    try:
        page.reload()
        page.locator('li[data-id="jp-workbench-sidebar"]').click()
        sidebar = page.locator("#jp-workbench-sidebar")
        sidebar.get_by_role("progressbar").wait_for(timeout=60_000)
        values = {name: page.locator(f"#jp-Workbench-capture-{name}").input_value()
                  for name in ("model", "variants", "batch", "iterations", "threads", "overrides")}
        assert values == {"model": "mlp", "variants": "eager", "batch": "3", "iterations": "100000", "threads": "1",
                          "overrides": "hidden=32 in_features=16 num_classes=10"}
        shot(page, "23-reload-mid-capture")
        # the progress names the variant being prepared: a task of its own within "prepare"
        page.wait_for_function("() => fetch('/workbench/api/jobs').then(r => r.json()).then(reply => "
                               "reply.jobs.some(job => 'prepare eager' in job.progress.tasks))", timeout=120_000)
    finally:
        api(lab, "DELETE", f"jobs/{job['id']}")
