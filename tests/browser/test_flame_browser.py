"""The call tree tab in a real `jupyter lab` with headless Chromium, on a real GPU trace (ResNet-50, Kineto): the
flame graph's total over its range equals the sum of the top-level host ops computed from the raw trace; a click on a
box zooms the flame graph to it and jumps the timeline to that path's first call; a click on a row of the kernels by
launching op table jumps the timeline to that kernel. Screenshot: docs/images/flame-graph.png."""

# ruff: noqa: F811 (the Lab fixtures imported below are used as fixture parameters of the same names)
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import fixture_path
from test_call_tree import RESNET, raw_top_level_ns
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

from workbench.trace import read_trace
from workbench.trace.store.bundle import write_bundle
from workbench.views.flame import FLAME_HEADING, FLAME_PLOT, FLAME_SOURCE, KERNELS_TABLE

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
RUN = "resnet50-flame"
DOC = "Bokeh.documents.find((d) => d.get_model_by_name('flame nodes'))"
"""The embedded dashboard's BokehJS document (the one holding the flame graph)."""
MODELS = f"""const doc = {DOC};
const flame = doc.get_model_by_name({json.dumps(FLAME_PLOT)});
const nodes = doc.get_model_by_name({json.dumps(FLAME_SOURCE)});
const timeline = doc.get_model_by_name('timeline'), xr = timeline.x_range;
const table = doc.get_model_by_name({json.dumps(KERNELS_TABLE)});"""

TOOLTIP = """() => {
  const texts = [];
  const walk = (root) => {
    for (const e of root.querySelectorAll('*')) {
      if (e.shadowRoot) walk(e.shadowRoot);
      if (e.classList.contains('bk-tooltip-content')) texts.push(e.innerText);
    }
  };
  walk(document);
  return texts.join('\\n');
}"""
"""The text of the tooltips on the page (Bokeh draws them in its views' shadow DOMs)."""


def evaluate(page, body: str, arg=None):
    """Run `body` (JS statements ending in a return) with the flame graph's and the timeline's models in scope."""
    return page.evaluate(f"(arg) => {{ {MODELS}\n{body} }}", arg)


def wait_for(page, condition: str, arg=None, timeout: int = 60_000) -> None:
    page.wait_for_function(f"(arg) => {{ if (!{DOC}) return false; {MODELS}\n{condition} }}",
                           arg=arg, timeout=timeout)


@pytest.fixture(scope="module")
def gpu_run(lab) -> str:
    trace = read_trace(fixture_path(*RESNET))
    info = {"model": {"name": "resnet50"}, "variant": {"name": "kineto import"}, "device": "cuda:0"}
    write_bundle(lab.traces, RUN, info, trace)
    return RUN


def raw_expectation() -> tuple[float, int]:
    """From the raw file: the summed time (ns) of the host ops no op encloses, over the whole trace (the range of a
    run without a measure phase), and how many they are."""
    with gzip.open(fixture_path(*RESNET), "rt") as raw:
        events = [e for e in json.load(raw)["traceEvents"] if e.get("ph") == "X"]
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    per_thread = raw_top_level_ns(events, (0, span)).values()
    return sum(ns for ns, _ in per_thread), sum(count for _, count in per_thread)


def test_flame_graph_total_and_jumps(lab, page, gpu_run):
    IMAGES.mkdir(parents=True, exist_ok=True)
    raw_ns, top_ops = raw_expectation()
    page.locator("#jp-workbench-sidebar").get_by_role("button", name="Refresh", exact=True).click()
    run_row(page, gpu_run).wait_for(timeout=30_000)
    run_row(page, gpu_run).locator(".jp-Workbench-runName").click()
    view = view_selector([gpu_run])
    wait_for_plots(page, view)
    wait_for(page, "return doc.get_model_by_name('timeline remote')._wb_api != null")
    page.locator(view).get_by_text("call tree", exact=True).click()
    wait_for(page, "const v = Bokeh.index.find_one(flame); return v != null && v.frame.bbox.width > 0")

    # the total over the range, as the page holds it, is the raw trace's
    total = evaluate(page, "return nodes.data.total_ns[0]")
    assert total == pytest.approx(raw_ns, abs=1000 * top_ops)  # Kineto's µs: within 1 µs per op
    heading = evaluate(page, f"return doc.get_model_by_name({json.dumps(FLAME_HEADING)}).text")
    assert "the whole trace" in heading and f"total {raw_ns / 1e9:.3g} s" in heading and "on 2 threads" in heading
    evaluate(page, f"Bokeh.index.find_one(doc.get_model_by_name({json.dumps(FLAME_HEADING)})).el"
                   ".scrollIntoView({block: 'start'}); return null")
    page.wait_for_timeout(500)

    # the widest box below the steps: hovering it shows its figures
    node = evaluate(page, """const d = nodes.data;
let best = -1;
for (let i = 0; i < d.left.length; i++)
  if (d.top[i] >= 3 && (best < 0 || d.right[i] - d.left[i] > d.right[best] - d.left[best])) best = i;
const v = Bokeh.index.find_one(flame), box = v.el.getBoundingClientRect();
const x = (Math.max(d.left[best], flame.x_range.start) + Math.min(d.right[best], flame.x_range.end)) / 2;
return {i: best, name: d.name[best], left: d.left[best], right: d.right[best], start: d.first_start_ns[best],
        dur: d.first_dur_ns[best], px: box.left + v.frame.x_scale.compute(x),
        py: box.top + v.frame.y_scale.compute(d.y[best])};""")
    assert node["i"] >= 0 and node["name"]
    page.mouse.move(node["px"], node["py"])
    page.wait_for_function(f"(name) => ({TOOLTIP})().includes(name)", arg=node["name"], timeout=10_000)
    lines = page.evaluate(TOOLTIP).split("\n")
    assert node["name"] in lines[0] and any(line.startswith("calls:\t") for line in lines)
    assert any(line.startswith("total:\t") for line in lines)
    assert any(line.startswith("self:\t") and line.endswith(" ms") for line in lines)
    page.screenshot(path=str(IMAGES / "flame-graph.png"))

    # a click on it: the flame graph zooms to it, the timeline jumps to its first call
    away = "xr.setv({start: 900e6, end: 910e6}); return [xr.start, xr.end]"  # a narrow view far from both targets
    before = evaluate(page, away)
    page.mouse.click(node["px"], node["py"])
    wait_for(page, "return nodes.selected.indices[0] == arg", node["i"])
    wait_for(page, "return flame.x_range.start == arg[0] && flame.x_range.end == arg[1]", [node["left"], node["right"]])
    center = node["start"] + node["dur"] / 2
    wait_for(page, """const [start, dur, center] = arg, middle = (xr.start + xr.end) / 2;
return xr.start <= start && xr.end >= start + dur && Math.abs(middle - center) < (xr.end - xr.start) * 0.01""",
             [node["start"], node["dur"], center])
    assert evaluate(page, "return [xr.start, xr.end]") != before

    # a row of the kernels by launching op table jumps the timeline to that kernel's first run
    kernel = evaluate(page, """const d = table.source.data;
const i = d.kind.findIndex((k) => k == 'kernel');
return {i, start: d.first_start_ns[i], dur: d.first_dur_ns[i], name: d.name[i]};""")
    assert kernel["i"] >= 1
    evaluate(page, away)
    cell = evaluate(page, """const cell = Bokeh.index.find_one(table).grid.getCellNode(arg, 0);
cell.scrollIntoView({block: "center"});
const box = cell.getBoundingClientRect();
return [box.left + box.width / 2, box.top + box.height / 2];""", kernel["i"])
    page.mouse.click(*cell)
    wait_for(page, "return table.source.selected.indices[0] == arg", kernel["i"])
    wait_for(page, """const [start, dur] = arg;
return xr.start <= start && xr.end >= start + dur && Math.abs((xr.start + xr.end) / 2 - (start + dur / 2)) < 1000""",
             [kernel["start"], kernel["dur"]])
    assert page.seen.errors == []
    assert page.seen.dialogs == []
